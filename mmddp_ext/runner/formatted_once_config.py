"""A ``Config`` whose yapf-formatted text is made once per content."""
from typing import Optional, Union

from mmengine.config import Config


class FormattedOnceConfig(Config):
    """``Config`` that formats its text once for as long as the content
    stays the same.

    Differs from ``Config.pretty_text`` only in caching: MMEngine builds
    the config's Python text (a cheap string walk) and then formats it
    with yapf on every call. A runner's start calls it three to four times
    per process (``Runner._log_env`` on every rank; the visualizer's
    ``add_config`` and ``dump_config`` on rank 0), at 0.5 to 1 s each for
    a detector config on a 2-core CPU, every rank of every launch and
    restart. This property builds the unformatted text first and returns
    the formatted text of the last call when that text is unchanged;
    otherwise it formats as ``Config`` does. yapf's output depends only on
    its input text and the fixed style, so the result is the same string
    ``Config.pretty_text`` returns, also after the config is changed.
    """

    @classmethod
    def of(cls, cfg: Union[Config, dict]) -> 'FormattedOnceConfig':
        """``cfg`` as this class, sharing its content (callers copy).

        Args:
            cfg (Config | dict): The config, e.g. ``Runner``'s ``cfg``.

        Returns:
            FormattedOnceConfig: ``cfg`` itself when it is one already.
        """
        if isinstance(cfg, cls):
            return cfg
        if not isinstance(cfg, Config):
            return cls(cfg)
        other = cls.__new__(cls)
        other.__dict__.update(cfg.__dict__)
        return other

    @property
    def pretty_text(self) -> str:
        if not self._format_python_code:
            return super().pretty_text
        raw = self._unformatted_text()
        cached: Optional[tuple] = self.__dict__.get('_formatted_cache')
        if cached is not None and cached[0] == raw:
            return cached[1]
        text = super().pretty_text
        # Config.__setattr__ writes config keys; this is an attribute.
        object.__setattr__(self, '_formatted_cache', (raw, text))
        return text

    def _unformatted_text(self) -> str:
        """``Config.pretty_text`` with the yapf step switched off."""
        object.__setattr__(self, '_format_python_code', False)
        try:
            return super().pretty_text
        finally:
            object.__setattr__(self, '_format_python_code', True)
