"""The one compiled part, optional: libjpeg-turbo's partial decompression for crop regions
(`gpufeed.data.jpeg_region`). Where it cannot be built (no C compiler or no libjpeg headers:
Debian's `libjpeg-dev`), gpufeed installs without it and decodes whole JPEGs with simplejpeg."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gpufeed.data._jpeg_region",
            [
                "src/gpufeed/data/_jpeg_region.c",
                "src/gpufeed/data/_resample.c",
                "src/gpufeed/data/_store.c",
            ],
            depends=["src/gpufeed/data/_resample.h"],
            libraries=["jpeg"],
            # -ffp-contract=off: normalization rounds as torch does (no fused multiply-add)
            extra_compile_args=["-O3", "-pthread", "-ffp-contract=off"],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ]
)
