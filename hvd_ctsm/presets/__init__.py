"""The built-in training presets (YAML, read by hvd_ctsm.config.load_config). A package of its
own so that setuptools ships it by name, not as a stray data folder."""
