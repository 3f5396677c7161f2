"""``mooncake.store`` on Crescent: the same objects as :mod:`crescent.store`."""

from crescent.store import *  # noqa: F401,F403
from crescent.store import __all__  # noqa: F401
