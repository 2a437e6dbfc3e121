"""The local summarizer: a ledger of facts, turns and a narrative, with no model call."""
