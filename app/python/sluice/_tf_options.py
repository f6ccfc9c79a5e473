"""tf.data.Options as Sluice takes it: the settings a pipeline's options hold. Setting one that
Sluice has no counterpart for is refused by name, rather than silently doing nothing."""


class Options:
    """tf.data.Options: `deterministic` (None: the pipeline's default, which keeps order) and
    Sluice's own `seed`. Given to Dataset.with_options(); Dataset.options() gives them back."""

    _KNOWN = {"deterministic": "deterministic", "experimental_deterministic": "deterministic", "seed": "seed"}

    def __init__(self):
        object.__setattr__(self, "_values", {})

    def __setattr__(self, name, value):
        if name not in self._KNOWN:
            raise AttributeError(f"tf.data.Options.{name} has no Sluice counterpart (Sluice takes {', '.join(sorted(self._KNOWN))}); "
                                 f"Sluice's stages take their own parallelism=, buffer_size= and error_policy=")
        self._values[self._KNOWN[name]] = value

    def __getattr__(self, name):
        if name not in self._KNOWN:
            raise AttributeError(f"tf.data.Options.{name} has no Sluice counterpart (Sluice takes {', '.join(sorted(self._KNOWN))})")
        return self._values.get(self._KNOWN[name])

    def _pipeline_options(self):
        return {k: v for k, v in self._values.items() if v is not None}

    def __repr__(self):
        return f"Options({', '.join(f'{k}={v!r}' for k, v in sorted(self._values.items()))})"
