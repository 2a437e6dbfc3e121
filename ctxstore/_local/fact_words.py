"""The words and patterns :mod:`ctxstore._local.facts` reads prose with, and the kinds of fact.

Word lists (function words, cue words, units, months) and the regexes built
from them: typed values, sentences and clauses, statement cues (constraint,
decision, preference, request) and corrections. Data only; the reading is
:mod:`ctxstore._local.facts`'.
"""

from __future__ import annotations

import re
from enum import StrEnum


class FactKind(StrEnum):
    """What a fact is; also the ledger's sections, in this order."""

    REQUEST = "request"
    CONSTRAINT = "constraint"
    DECISION = "decision"
    PREFERENCE = "preference"
    IDENTIFIER = "identifier"
    NUMBER = "number"
    NAME = "name"
    DATE = "date"
    PATH = "path"
    ERROR = "error"
    TOOL = "tool"


STATEMENTS = frozenset(
    {FactKind.REQUEST, FactKind.CONSTRAINT, FactKind.DECISION, FactKind.PREFERENCE}
)
ENTITIES = frozenset({FactKind.IDENTIFIER, FactKind.NAME, FactKind.DATE, FactKind.PATH})


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


FUNCTION = _words(
    "a an the this that these those it its we i you they he she us me them our my your their his "
    "her and or but if then so as of to in on at by for from with into over under about than is "
    "are was were be been being will would should must can could may might do does did not no "
    "there here what which who whom whose all any some each every per up out just also now very "
    "really please let let's lets ok okay i'm i'll we'll we're it's that's there's you're they're "
    "i've we've you've i'd we'd "
    "behind across between through during without within via after before since until while "
    "today yesterday tomorrow right again because although though unless whereas"
)
# What ends a subject read leftwards from its value: function words, and the
# verbs and fillers that sit between a subject and its value.
# (Verbs that are nouns too, "call", "check", "update", are not here: "the review call is on".)
STOP = FUNCTION | _words(
    "use using used set setting keep make need needs have has had get got go going went run ran "
    "found find see saw try tried say said think know want like bump bumped raise raised lower "
    "lowered changed increase increased decrease decreased reduce reduced updated moved pin "
    "pinned switched put give take took wait ship add open read rerun allow send new old current "
    "currently actually correction instead only still maybe probably around roughly hit reached "
    "equals costs cost takes stays stay remain remains lives live sits located stored kept points "
    "defaults listens runs noted good great thanks sure yes done hi hello hey shipped finished "
    "ready landed merged live delivered released complete completed expect expected quoted shows "
    "show showed complains mentioned says reports reported touches contains lists gives returns"
)
_LINKS = _words(
    "is are was were be becomes = : -> → to of at by in on from under equals now lives live sits "
    "located stored kept stays stay remains points defaults hit reached costs takes took set "
    "bumped raised lowered changed moved switched updated increased decreased reduced dropped "
    "should must will resolved comes came out stands works has have needs need scheduled planned "
    "booked happens happening due down for"
)
# A subject tied to its value by a bare preposition ("the cache in lib/retry.py")
# is context, not what the value is: the value is not keyed by it.
_PREPOSITIONS = _words("in at on by from under for")
_FILLERS = _words(
    "around about roughly approximately exactly only just ~ version v currently still the a an "
    "no longer"
)
_IMPERATIVES = _words(
    "fix check update change move start stop deploy restart upgrade downgrade call look switch "
    "scale review test"
)
_ID_WORDS = _words(
    "id ticket order incident pr issue invoice build job case account customer bug commit po sku "
    "tracking"
)
_LIMIT_WORDS = _words("budget deadline limit cap quota max maximum min minimum sla slo")
_NOISE_LABELS = _words(
    "step phase part line lines page item option round attempt case test module chapter section "
    "figure table row column col ln no number"
)
_NAME_STOP = _words(
    "The This That These Those We I You It They Let Let's Next Then Now Also Please Thanks Thank "
    "Good Great Ok Okay Sure Yes No Done Module Step Here There Hi Hello Hey Sorry Note Update "
    "Correction Actually Scratch And But Or So If When After Before Once Our My Your Their What "
    "Why How Which Who Where Is Are Can Could Would Should Will Do Does Did Use Run Set Keep Make "
    "Check Open Read Fix Add See Looks Found Pin"
)
_NOT_TICKETS = _words("UTF SHA ISO AES MD TLS HTTP IPV X")
_NOT_SUBJECTS = _words("now this that it them us you me real good")

_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sept?(?:ember)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_UNITS = (
    r"%|ms|µs|us|ns|s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?|days?|weeks?|months?|years?"
    r"|[kKMGTP]i?B?|bytes|EUR|USD|GBP|CHF|€|rps|qps|req/s|tokens?|kg|g|lbs?|km|m|cm|mm|pts"
    r"|points|words|pages|x|\u00d7"  # "2x", "2" + times
)
_SERVICE = (
    r"service|svc|api|worker|client|server|gateway|db|cache|queue|proxy|bot|app|ui|web|cli|sdk"
    r"|core|engine|store|daemon|exporter|importer|scheduler|cron|pipeline|cluster"
)
# One pass over a clause; at each position the first group that matches wins, so
# a ticket or a date is never also read as numbers.
_VALUE = re.compile(
    r"(?P<url>\b[a-z][a-z0-9+.-]{1,9}://[^\s<>\"'`)\]]*[^\s<>\"'`)\].,;:!?])"
    r"|(?P<email>\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b)"
    r"|(?P<path>(?<![\w/.])(?:~|\.{1,2})?/(?:[\w.@-]+/)*[\w@-][\w.@-]*(?<!\.)"
    r"|\b(?:[\w.-]+/)+[\w-]+\.[A-Za-z]\w{0,4}\b|\b(?:[\w-]+/){2,}[\w-]*"
    r"|\b[\w-]+\.(?:py|js|ts|tsx|go|rs|java|rb|md|txt|json|ya?ml|toml|cfg|ini|sql|sh|csv|html"
    r"|css|lock|log|env|conf|xml|proto|tf)\b)"
    rf"|(?P<date>\b\d{{4}}-\d{{2}}-\d{{2}}(?:[T ]\d{{2}}:\d{{2}}(?::\d{{2}})?Z?)?\b"
    rf"|\b{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?\b(?:,? \d{{4}}\b)?"
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)? (?:of )?{_MONTH}\b(?:,? \d{{4}}\b)?"
    r"|\b(?:next |this )?(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day\b|\bQ[1-4](?: \d{4})?\b"
    r"|\bend of (?:the )?(?:day|week|month|quarter|sprint|year)\b)"
    r"|(?P<id>\b10\.\d{4,9}/[\w.;()/:-]*\w|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"
    r"|\b\d{2,}(?:-\d{2,}){2,}\b|\bsha(?:1|256|512):[0-9a-f]{7,}\b"
    r"|\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b"
    r"|\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"
    r"|\b[\w.-]+(?:==|@)\d[\w.+-]*\w|\b[A-Z][A-Z0-9]{1,9}-\d{1,7}(?![\w-])|(?<![\w&])#\d{2,7}\b"
    r"|\bv\d+(?:\.\d+)+\b|\b\d+\.\d+\.\d+(?:-[\w.]+)?\b"
    r"|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"
    # generated ids: "acct_scQoYod3", "TR-963-D5Ns", "exp_JXPZeW", "1ZSocCmP298379"
    r"|\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9]+(?:[_-][A-Za-z0-9]+)+\b"
    r"|\b[a-z]{2,8}_(?=\w*[A-Z])(?=\w*[a-z])[A-Za-z0-9]{4,}\b"
    r"|\b(?=[A-Za-z]*\d)(?=\d*[A-Za-z])[A-Za-z0-9]{10,}\b|\b[a-z][a-z0-9]*(?:_[a-z0-9]+){2,}\b)"
    r"|(?P<error>\bE[A-Z]{4,}\b(?: \d{1,3}(?:\.\d{1,3}){3}(?::\d+)?)?"  # "ECONNRESET 10.0.0.7"
    r"|\b[A-Z][A-Za-z]+(?:Error|Exception|Fault)\b)"
    r"|(?P<name>\b(?:[A-Z][a-z]+|[A-Z]\.)(?:[ -][A-Z][a-z]+){1,2}\b"
    rf"|\b[a-z][a-z0-9]*(?:-[a-z0-9]+)*-(?:{_SERVICE})\b)"
    r"|(?P<number>(?<![\w.,/#:$€£-])[$€£]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
    rf"(?:\s?(?:{_UNITS})(?!\w))?(?:\s?(?:req/s|rps|qps|/s|/sec|/min|/h|/day)\b)?"
    r"(?![.,:/-]?\w))"
)
_VALUE_KINDS = {
    "url": FactKind.IDENTIFIER,
    "email": FactKind.IDENTIFIER,
    "id": FactKind.IDENTIFIER,
    "error": FactKind.IDENTIFIER,  # an error someone names: only a failed tool call is an Error
    "path": FactKind.PATH,
    "date": FactKind.DATE,
    "name": FactKind.NAME,
    "number": FactKind.NUMBER,
}
_ROLE_NAME = re.compile(
    r"\b(?:reviewer|owner|lead|manager|contact|assignee|approver|on-?call|author|maintainer"
    r"|admin|customer|requester|stakeholder|sponsor|architect|engineer)(?:\s+is|\s*[:=])?\s+"
    r"(?P<v>[A-Z][a-z]+(?: [A-Z][a-z]+)?)\b"
    r"|\b(?:ask|ping|cc|tell|loop in|email|contact)\s+(?P<w>[A-Z][a-z]{2,})\b"
)
# An error name someone reports: "Error from my side: x_y_z", "it crashed with `x_y`".
_REPORTED = re.compile(
    r"\b(?:error(?: from my side)?:|crashed with|died(?: again)? with|fails? with|failing with"
    r"|i get|seeing|root of it:|exception:?|raised)\s+`?(?P<v>[a-z]+(?:_[a-z0-9]+){1,5})\b",
    re.I,
)
TOKEN = re.compile(r"->|[:=→~]|[\w$€£#][\w.+#/@'$€£%-]*")
_WORD = re.compile(r"[a-z0-9][\w.+/@'%-]*[a-z0-9%]|[a-z0-9]")

_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[^a-z\s])|\n+")
_CLAUSE = re.compile(
    r";\s+|\s+--?\s+|,\s+(?:and\s+|but\s+|so\s+)?(?=(?:the|we|I|it|our|my|you|they|please|never"
    r"|don't|do not|let's|also)\b)"
)
BULLET = re.compile(r"^\s*(?:[-*•>]|\d{1,2}[.)])\s+")
_MARKER = re.compile(
    r"^(?:(?:actually|correction|update|scratch that|wait|sorry|oops|my mistake|change of plans?"
    r"|ok|okay|so|also|and|but|good|great|thanks|noted|sure|right|next|then|now|first|finally"
    r"|lastly|after that|afterwards)\b[\s,:;.!-]*)+",
    re.I,
)
_CORRECTIVE = re.compile(
    r"^(?:(?:hmm+|hm|oh|ah|well|ok|okay|so|right|no)\W+)?(?:actually|correction|update"
    r"|scratch that|(?:no,? )?wait|sorry|oops|my mistake"
    r"|change of plans?|on second thought|make (?:that|it))\b|\bafter all\W*$"
    r"|\binstead\b|\bchanged (?:our|my) minds?\b|\bvetoed\b"
    r"|\bi (?:recomputed|recalculated|rechecked|re-?ran|forgot|overlooked|missed|mixed up)\b"
    r"|\b(?:new direction|(?:that|this) changes|changes things)\b"
    r"|\b(?:mis(?:spoke|read|typed|quoted|remembered)|i was wrong|turns out|going forward"
    r"|from now on|re-?(?:booked|named|ran|run|measured|assigned)|renamed|rebooked"
    r"|hand(?:ing|ed)(?: \S+)? (?:to|over|off)|wrong (?:one|path|link|url|file|number|figure"
    r"|value|date|id|name|address|email|plan|version|\w+(?=,? sorry))|should (?:be|read)"
    r"|(?:is|are) out,)\b"
    # A value that moved: "slipped to", "pushed the deadline to", "redlined it down to".
    r"|\b(?:slipped|slips|pushed|pulled|raised|lowered|bumped|cut|dropped|extended|shortened"
    r"|rescheduled|postponed|delayed|brought forward|moved|reduced|increased|upped|changed"
    r"|corrected|replaced|switch(?:ed)?|swapped|scaled|migrated|upgraded|downgraded"
    r"|reassigned|rolled|roll)\b(?:\s+\S+){0,4}?\s+(?:up |down |back |forward )?(?:to|from)\b"
    r"|\bcorrected from\b|\bno longer\b|\s(?:->|→|=>)\s"
    r"|\b(?:correcting myself|earlier note|re-?checked|scratch what|forget|got .{1,40} wrong)\b"
    r"|\b(?:instead of|rather than|changed? (?:it )?to|moved to|is now|are now|no longer"
    r"|switch(?:ed)? to|bump(?:ed)? to|updated to|revised to|not\s.{1,40}\bbut)\b",
    re.I,
)
_WAS = re.compile(
    r"\b(?:instead of|rather than|in place of|no longer(?: use| using| on| at| in| be)?"
    r"|not(?=\s.{1,40}\bbut\b)|,\s*not)\s+(?P<old>.+?)(?=[,;.!?](?:\s|$)|[()]|$"
    r"|\s(?:but|because|since|so|for|as|and|which)\b)",
    re.I,
)
_WAS_MORE = [
    re.compile(p, re.I)
    for p in (
        r"\((?:it |that )?was (?P<old>[^)]+)\)",  # "... (it was Ambergate Systems)"
        r"\((?:previously|previous:|formerly|before:?|old:)\s*(?P<old>[^)]+)\)",
        r"\(i typed (?P<old>[^)\s]+)",
        r"\bwas (?P<old>\S+), now\b",
        r"\b(?:rather|prefer\w*)\b.{1,60}?\bthan\s+(?P<old>[^,;.()]+)",
        r"^forget (?P<old>.+?) for (?:the |our )?\w",
        # "reassigned from Marcus to Priya", "changed from 84,893 seconds to 8,057 seconds"
        r"\b(?:re\w+ed|moved|changed|switched|swapped|bumped|raised|lowered|cut|increased"
        r"|reduced|upgraded|downgraded|migrated|went|shifted|renamed)\b(?:\s+\S+){0,4}?"
        r"\s+from\s+(?P<old>[^,;()]+?)\s+(?:to|into|onto)\s",
        r"^(?P<old>[^,;:()]{1,40}?) (?:is|are) out\b",  # "Jest is out, Vitest is in"
        r"\breplac(?:e|es|ed|ing) (?P<old>[^,;()]+?) (?:with|by)\s",  # "replace X with Y"
    )
]
_PREFER_OVER = re.compile(r"\bover\s+(?P<old>[\w.+#/-]+(?: [\w.+#/-]+)?)", re.I)
_CONSTRAINT = re.compile(
    r"^no (?!problem|idea|worries|rush|need|luck|one|way|,)\w+|\b(?:nobody|no one) should\b"
    r"|\b(?:can't|cannot|can not|may not|should(?:n't| not)) (?!find|see|tell|reproduce|figure|get|"
    r"remember|believe|access|open|log|wait|say)\w+"
    r"|\b(?:must|mustn't|never|at most|at least|no more than|no less than|not exceed|under no"
    r"|required|mandatory|(?:budget|deadline)(?: is|:| of)\b(?=.*\d)|limit(?:ed)? to|only use"
    r"|not allowed|forbidden|avoid"
    r"|(?:you|we|it) (?:cannot|can't|can not)|let's not|let us not)\b"
    r"|(?:^|\b(?:please|and|but|so|also)\s+)(?:don't|do not)\b",
    re.I,
)
_DECISION = re.compile(
    r"\b(?:decided|decide to|decision|we(?:'ll| will) (?:use|go with|keep|switch|move|adopt|ship"
    r"|drop|stay)|let's (?:use|go with|keep|switch|move|adopt|stick with|drop)|going with|go with"
    r"|chose|chosen|settled on|agreed|opted (?:for|to)|the plan is|we(?:'re| are) going to"
    r"|switch(?:ing|ed)?\b.{0,40}\bto|stick with|recommend|picked|final answer|wins for|went with"
    r"|going for|let's do|new direction|call made|made the call|going ahead with"
    r"|(?:i'm|we're|i am|we are) moving to)\b|^use\b(?!.*\bas\b)",
    re.I,
)
# Standing instructions on how to work: language, format, tools, style.
_PREFERENCE = re.compile(
    r"\b(?:i(?:'d| would)? prefer|i(?:'d| would) rather|we prefer|prefer(?:ably)?|my preference"
    r"|always|please use|please keep|i like|i want you to use|from now on|that's what i (?:run|use)"
    r"|house style|don't want anything else|(?:answer|reply|respond)(?:s)? in|call me"
    r"|(?:quote|give)(?: me)?(?: any)? (?:times|commands)|times in|format \w+ as|reformat"
    r"|keep (?:the )?(?:answers|replies|responses)|short (?:answers|replies)|so the tables line up"
    r"|where i am|convert to|write (?:your )?(?:answers|replies|commit messages|sql)|palette)\b",
    re.I,
)
_REQUEST = re.compile(
    r"^(?:please|can you|could you|would you|i need|i want|we need|let's|help|pls)\b|\?$"
    r"|^(?:add|fix|implement|write|run|check|look|open|update|create|remove|delete|deploy|migrate"
    r"|refactor|investigate|find|make|build|review|pin|set|change|move|rename|test|debug|figure"
    r"|explain|show|list|summarize|draft|send|prepare|generate|install|upgrade|configure|ship"
    r"|start|stop|restart|rollback|revert|merge|go|get|keep|try|help)\b",
    re.I,
)
# Words that make "X is V" more than an attribute ("under 300 ms", "must not").
_QUALIFIER = re.compile(
    r"\b(?:under|below|above|over|less|more|most|least|max|min|within|never|not|don't|must|only"
    r"|exceed|until|before|after)\b",
    re.I,
)
_AS = re.compile(
    r"\s+(?:as (?:the |our |a |an )?|is (?:the |our |my |your ))(?P<s>[a-z][\w' -]{2,50}?)"
    r"(?=\s+in anything\b|\s+for\b|\s*[,.;:!?]|\s*$)",
    re.I,
)
# "I got the security review wrong earlier. It's September 6.": the next value's subject.
_WRONG = re.compile(
    r"\b(?:got|had|have) (?:the |my |our )?(?P<a>[\w' -]{3,40}?) wrong\b"
    r"|\b(?:correction|update|change of preference|change|revised \w+|new value) (?:on|for) "
    r"(?:the )?(?P<b>[\w' -]{3,40}?):"
    r"|\b(?:scratch|forget) what i said about (?:the )?(?P<c>[\w' -]{3,40}?)(?=\s+-|[,:;.])"
    r"|\b(?:note|what i said) (?:on|about) (?:the )?(?P<d>[\w' -]{3,40}?) was wrong\b"
    r"|\bre-?checked (?:the )?(?P<e>[\w' -]{3,40}?):|^the (?P<f>[\w' -]{3,40}?) changed:",
    re.I,
)
_REASON = re.compile(
    r"^(?:because|since|so that|that's because|this is because|the reason)\b", re.I
)
# What a decision or preference is about: "X for the store", "final answer on the Y is X",
# "the job queue uses X", "switching the pagination style to X".
_TOPIC = re.compile(
    r"\b(?:for|on) (?:the |our |all |a )?(?P<a>[a-z][\w-]*(?: [a-z][\w-]*){0,3}?)"
    r"(?=\s+(?:is|are|because|since|so|as)\b|\s*[,.;:!?-]|$)"
    r"|\bthe (?P<b>[a-z][\w-]*(?: [a-z][\w-]*){0,3}?) (?:uses|is|will be|goes)\b"
    r"|\bswitch\w* (?:the |our )?(?P<c>[a-z][\w-]*(?: [a-z][\w-]*){0,3}?) to\b",
    re.I,
)
