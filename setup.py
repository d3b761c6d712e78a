# The only thing pyproject.toml cannot say: build the C core with cffi.
from setuptools import setup

setup(cffi_modules=["dataplane/csrc/build_ffi.py:ffibuilder"])
