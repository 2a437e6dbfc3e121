"""How things are laid out in Redis: keys, the entry codec, chains, message formats, validation.

And the bounded memo the parts keep per process. No I/O.
"""
