"""The pinned server image: CUDA 12.8 + SGLang 0.5.9 + FlashInfer 0.6.3, built and verified.

``build(image, engine_url, console)`` builds it (unless its content tag exists); ``verify(tag,
launch_argv, engine_url)`` checks inside it, without a GPU, that it holds what the pins promise.
``image_tag(image)`` is the one definition of the tag. ``python -m gpunode.image`` for manual use.
"""

from gpunode.image.build import BuildError, BuildResult, build
from gpunode.image.context import image_tag
from gpunode.image.verify import Finding, VerifyError, VerifyReport, verify

__all__ = ["BuildError", "BuildResult", "Finding", "VerifyError", "VerifyReport", "build", "image_tag", "verify"]
