"""Numbers read from text (parsing.py, cli.Parser's flags, model.window_pattern, train.time_budget, evaluate.py's
--lengths): ASCII decimal digits as documented, and one error line naming the setting and value otherwise."""
import pytest

from cli import Parser
from errors import ConfigError, UsageError
from model import ModelConfig, Transformer
from parsing import decimal_number, signed_number, whole_number, whole_numbers
from training.budget import parse_duration

# what Python's int() or str.isdigit() take, and no setting here documents
NOT_ASCII_DIGITS = ["²", "٣", "３", "1²", "٣2"]  # a superscript, Arabic-Indic and fullwidth digits
NOT_WHOLE = [*NOT_ASCII_DIGITS, "", "+3", "-3", " 3", "3 ", "3_0", "3.0", "0x3"]


@pytest.mark.parametrize("text", NOT_WHOLE)
def test_a_whole_number_is_ascii_digits_alone(text):
    assert whole_number(text) is None


def test_ascii_digits_read_as_their_number():
    assert (whole_number("0"), whole_number("0042"), signed_number("-7"), decimal_number(".5"),
            decimal_number("1e-3")) == (0, 42, -7, 0.5, 0.001)
    assert whole_numbers("128,256,512") == [128, 256, 512]


@pytest.mark.parametrize("text", ["128,,256", "128,", ",128", "128, 256", "128,+256", "128,٣", ""])
def test_a_list_with_an_empty_or_unreadable_part_is_refused_whole(text):
    assert whole_numbers(text) is None


@pytest.mark.parametrize("flag, value, message", [
    ("--n", "٣", "argument --n: '٣' is not an integer written in ASCII digits"),
    ("--n", "²", "argument --n: '²' is not an integer written in ASCII digits"),
    ("--n", "+3", "argument --n: '+3' is not an integer written in ASCII digits"),
    ("--n", " 3", "argument --n: ' 3' is not an integer written in ASCII digits"),
    ("--x", "٣.5", "argument --x: '٣.5' is not a number written in ASCII digits"),
    ("--x", "1_0", "argument --x: '1_0' is not a number written in ASCII digits")])
def test_a_numeric_flag_refuses_other_digits_in_one_line(flag, value, message):
    parser = Parser()
    parser.add_argument("--n", type=int)
    parser.add_argument_group("a group's flags read the same").add_argument("--x", type=float)
    with pytest.raises(UsageError) as refused:
        parser.parse_args([flag, value])
    assert str(refused.value) == message
    assert vars(parser.parse_args(["--n", "-3", "--x", "nan"]))["n"] == -3  # each flag's own range refuses these


@pytest.mark.parametrize("pattern", [*NOT_ASCII_DIGITS, "²:1", "٣:1", "+2:1", " 2:1", "2 :1", ":1", "2:", "0:1",
                                     "2:1:1", "2:2"])
def test_a_window_pattern_other_than_its_forms_is_refused_naming_it(pattern):
    with pytest.raises(ConfigError) as refused:
        Transformer(ModelConfig(window=8, window_pattern=pattern))
    assert str(refused.value) == (f"model.window_pattern={pattern!r} must be all, alternate or N:1 (N local layers "
                                  f"to one global, e.g. 5:1)")


def test_a_window_pattern_in_ascii_digits_makes_its_layers_local():
    assert ModelConfig(window=8, window_pattern="3:1", n_layers=5).layer_windows == [8, 8, 8, None, 8]


@pytest.mark.parametrize("budget", ["٣m", "²", "1_0", "1²s", "٣"])
def test_a_time_budget_in_other_digits_is_refused_naming_it(budget):
    with pytest.raises(ConfigError, match=r"^train\.time_budget="):
        parse_duration(budget)
