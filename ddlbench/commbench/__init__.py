"""`bench commbench`: bus bandwidth per collective and message size on the ranks at hand (command.py),
across two network dimensions (dims.py), and the alpha-beta fit of what it measured."""
