"""The one compiled part, optional: libjpeg-turbo's partial decompression for crop regions
(`gpufeed.data.jpeg_region`). Where it cannot be built (no C compiler or no libjpeg headers:
Debian's `libjpeg-dev`), gpufeed installs without it and decodes whole JPEGs with simplejpeg."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gpufeed.data._jpeg_region",
            ["src/gpufeed/data/_jpeg_region.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
