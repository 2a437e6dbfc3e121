"""Pure planning: the view's shape, tool pairs, growth, offload previews. No I/O."""
