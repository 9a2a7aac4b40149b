"""How ranks are started. local: torch elastic launch API on this machine."""
