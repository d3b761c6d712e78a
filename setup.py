# What pyproject.toml cannot say: build the C core with cffi, and copy the
# lab files and scenarios (netns-labs/, their one source) into the package,
# so that a wheel carries them (dataplane/netns_labs/; model/library.py).
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

LABS = Path(__file__).resolve().parent / "netns-labs"


class BuildPyWithLabs(build_py):
    def run(self):
        super().run()
        dest = Path(self.build_lib) / "dataplane" / "netns_labs"
        for src in sorted(LABS.rglob("*.toml")):
            out = dest / src.relative_to(LABS)
            out.parent.mkdir(parents=True, exist_ok=True)
            self.copy_file(str(src), str(out))


setup(
    cffi_modules=["dataplane/csrc/build_ffi.py:ffibuilder"],
    cmdclass={"build_py": BuildPyWithLabs},
)
