"""The package carries native code (libunisum.so and the unisum CLI, which
the CMake build copies into unisum/): its wheel is tagged for this Python
and platform, not as pure Python.  Everything else is in pyproject.toml."""
from setuptools import setup
from setuptools.dist import Distribution


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(distclass=BinaryDistribution)
