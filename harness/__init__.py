"""DynamicRubric harness: the machine room (CLI, config, registry, backends, call cache, run store)."""

__version__ = "0.1.0"
