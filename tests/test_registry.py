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
