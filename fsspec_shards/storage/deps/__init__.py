"""Where we use a dependency beyond its public API: one module per dependency, each use
named in its docstring, each guarded by ``tests/deps/test_<dependency>.py`` (which fails
loudly when the dependency changes what we rely on)."""
