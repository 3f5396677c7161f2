"""The original's package name, provided by Crescent: ``from mooncake.store import MooncakeDistributedStore``
runs unmodified against a Crescent cluster. Installing Crescent's wheel replaces the original's ``mooncake.store``
in that environment."""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
