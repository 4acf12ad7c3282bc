"""Plain eager PyTorch (the current release): the study's baseline."""

from .base import Backend


class Eager(Backend):
    name = "eager"
    env = "upstream"
    image = "eager"
    image_lock = "upstream"
    order = 0

    def check(self, spec: dict) -> list[str]:
        if spec["compile"] == "inductor":
            return [
                "backend 'eager' means no torch.compile (got compile 'inductor'); "
                "use backend 'inductor' for torch.compile with inductor"
            ]
        return []


BACKEND = Eager()
