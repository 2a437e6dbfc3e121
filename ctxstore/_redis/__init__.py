"""The Redis edge: the only code that imports redis."""
