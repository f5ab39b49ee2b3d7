"""Builds librocev2 (the crate one directory up, as a cdylib) with cargo and
bundles it inside the package as rocev2/librocev2.abi3.so, so that
``pip install ./python`` (or ``pip wheel ./python``) gives a package that
imports with no environment variable. Build needs: a Rust toolchain (cargo),
libibverbs-dev, librdmacm-dev and libclang-dev (the verbs backend). At run
time the library links the system's libibverbs.so.1, which is never bundled.
"""
from setuptools import setup
from setuptools_rust import Binding, RustExtension, Strip

setup(
    rust_extensions=[
        RustExtension(
            "rocev2.librocev2",
            path="../Cargo.toml",
            binding=Binding.NoBinding,
            py_limited_api=True,
            strip=Strip.Debug,
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp38"}},
    zip_safe=False,
)
