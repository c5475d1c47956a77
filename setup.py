from setuptools import find_packages, setup

FOLDERS = ["producers", "consumers", "pipeline", "storage", "schemas", "gateway", "console"]
package_dir = {f"memstream.{f}": f for f in FOLDERS}
packages = [
    p
    for f in FOLDERS
    for p in [f"memstream.{f}", *(f"memstream.{f}.{s}" for s in find_packages(f))]
]
setup(packages=packages, package_dir=package_dir)
