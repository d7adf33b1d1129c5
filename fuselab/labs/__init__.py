"""Per-lab definitions shared by the notebooks, the tests and the grader: launcher prototypes, the lab's fixed
unfused reference kernels, input makers, float64 references and the two shape sets (small for the CPU
emulation and the visible tests, GPU-sized for timing and the hidden tests)."""
