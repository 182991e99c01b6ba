"""Examples of the GenRM workspace (importable so that ``--custom-rm-path examples....`` works)."""
