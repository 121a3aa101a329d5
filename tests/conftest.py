"""Shared pytest configuration."""

from hypothesis import HealthCheck, settings

# Property-based tests: in CI a fixed, modest number of examples, the same on every machine
# (derandomized); ``--hypothesis-profile explore`` searches far more, at random.
_COMMON = {"deadline": None, "database": None,
           "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
settings.register_profile("ci", max_examples=60, derandomize=True, **_COMMON)
settings.register_profile("explore", max_examples=3000, **_COMMON)
settings.load_profile("ci")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and CuPy")
