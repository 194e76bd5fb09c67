"""Small value checks that ModelConfig and the kinds' own validate share (model/config.py, model/moe.py)."""


def is_number(value) -> bool:
    """An int or a float, not a bool (YAML's true is an int to Python)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
