fn main() {
    // Exposes the `Py_3_12`-style cfgs for the interpreter being built against.
    pyo3_build_config::use_pyo3_cfgs();
}
