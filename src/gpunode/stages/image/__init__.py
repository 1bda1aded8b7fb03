"""The server image of a stack (images/sglang/stacks), built and verified: the image stage.

``build(image, engine_url, console)`` builds it (unless its content tag exists); ``verify(tag,
launch_argv, engine_url)`` checks inside it, without a GPU, that it holds what the pins promise.
``image_tag(image)`` is the one definition of the tag; ``stage.run`` is the stage.
"""

from gpunode.stages.image.build import BuildError, BuildResult, build
from gpunode.derive.imagecontext import image_tag
from gpunode.stages.image.verify import Finding, VerifyError, VerifyReport, verify

__all__ = ["BuildError", "BuildResult", "Finding", "VerifyError", "VerifyReport", "build", "image_tag", "verify"]
