"""No launcher: the backend environment's python runs the harness directly."""

from .base import Launcher


class Plain(Launcher):
    name = "none"


LAUNCHER = Plain()
