"""The command line's parts: argument parsing, rendering, the history commands, the demo."""
