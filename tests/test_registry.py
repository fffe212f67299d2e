import pytest

from spotrl.registry import Registry


def test_register_lookup_and_errors():
    reg: Registry = Registry("widget")

    @reg.register("a")
    def a():
        return 1

    assert reg["a"] is a and "a" in reg and reg.names() == ["a"]
    with pytest.raises(ValueError, match="no widget 'b'; known: \\['a'\\]"):
        reg["b"]
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(a)


def test_lazy_providers():
    from spotrl.registry import PROVIDERS, registry
    from spotrl.rl.advantages import ADVANTAGE_ESTIMATORS, PER_TOKEN_ADVANTAGE_ESTIMATORS

    assert registry("advantage estimator") is ADVANTAGE_ESTIMATORS
    assert registry("per-token advantage estimator") is PER_TOKEN_ADVANTAGE_ESTIMATORS
    assert "grpo" in registry("advantage estimator")
    with pytest.raises(ValueError, match="no KL estimator 'k9'; known: \\['k1', 'k2', 'k3'\\]"):
        registry("KL estimator")["k9"]
    for kind in PROVIDERS:  # every provider module makes the registry it is named for
        assert registry(kind).kind == kind
    with pytest.raises(ValueError, match="already exists"):
        Registry("verifier")  # a second registry of a provided kind would split its names
    with pytest.raises(KeyError, match="no provider"):
        registry("widget")
