"""torch.compile with TorchInductor (the current release): C++ kernels built at run time,
so its image adds the compiler to the eager image."""

from .base import Backend


class Inductor(Backend):
    name = "inductor"
    env = "upstream"
    image = "inductor"
    image_parent = "eager"
    default_compile = "inductor"
    order = 1

    def check(self, spec: dict) -> list[str]:
        if spec["compile"] != "inductor":
            return [
                f"backend 'inductor' means torch.compile with inductor (got compile "
                f"{spec['compile']!r}); use backend 'eager' for no compile"
            ]
        return []


BACKEND = Inductor()
