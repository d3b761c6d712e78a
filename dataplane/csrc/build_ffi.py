"""cffi build script (out-of-line API mode); run by setuptools via setup.py.

It must not import the dataplane package.  The cdef is the public header
itself, run through the C preprocessor with ETHP_CDEF so that the counter
X-macro expands exactly as the C compiler sees it.
"""

import pathlib
import subprocess

from cffi import FFI

CSRC = pathlib.Path(__file__).resolve().parent
HEADER = CSRC / "ethp.h"


def _cdef_text() -> str:
    out = subprocess.run(
        ["cc", "-E", "-P", "-DETHP_CDEF", str(HEADER)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out


ffibuilder = FFI()
ffibuilder.cdef(_cdef_text())
ffibuilder.set_source(
    "dataplane._ethp",
    '#include "ethp.h"',
    sources=sorted(str(p.relative_to(CSRC.parent.parent)) for p in CSRC.glob("*.c")),
    include_dirs=[str(CSRC)],
    extra_compile_args=[
        "-O2",
        "-std=gnu11",
        "-Wall",
        "-Wextra",
        "-Werror=implicit-function-declaration",
    ],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
