"""Storages. Import each from its module (e.g. `unienv_data.storages.flattened.FlattenedStorage`); this package
imports nothing heavy itself, so `import unienv_data.storages` never needs torch."""
