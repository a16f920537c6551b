"""rocketmq_spark.codec.sql92 gives the deliveries of Apache RocketMQ's SQL92 filter (the shared
table in tests/sql92_cases.py) and refuses what its parser refuses, saying what and where."""

from __future__ import annotations

import pytest

from rocketmq_spark.codec.sql92 import Sql92Error, Sql92EvaluationError, Sql92Filter, compile_sql92
from sql92_cases import SQL92_CASES


@pytest.mark.parametrize(("expression", "properties", "delivered"), SQL92_CASES,
                         ids=[f"{i}:{c[0]}" for i, c in enumerate(SQL92_CASES)])
def test_the_shared_cases(expression: str, properties: dict[str, str], delivered: bool) -> None:
    sql = compile_sql92(expression)
    assert isinstance(sql, Sql92Filter)
    assert sql.expression == expression
    assert sql.matches(properties) is delivered


def test_the_shared_table_is_well_formed() -> None:
    # what a real broker's producer can send: plain non-blank string values, no system names
    system = {"KEYS", "TAGS", "WAIT", "DELAY", "UNIQ_KEY", "CLUSTER", "MIN_OFFSET", "MAX_OFFSET"}
    assert len(SQL92_CASES) >= 40
    for expression, properties, delivered in SQL92_CASES:
        assert isinstance(expression, str) and isinstance(delivered, bool)
        for name, value in properties.items():
            assert isinstance(name, str) and isinstance(value, str) and value.strip(), (expression, name)
            assert name not in system


def test_evaluate_tells_unknown_and_failure_apart() -> None:
    assert compile_sql92("a > 5").evaluate({"a": "6"}) is True
    assert compile_sql92("a > 5").evaluate({"a": "4"}) is False
    assert compile_sql92("a > 5").evaluate({}) is None
    with pytest.raises(Sql92EvaluationError, match="abc"):
        compile_sql92("a > 5").evaluate({"a": "abc"})
    with pytest.raises(Sql92EvaluationError, match="ClassCastException"):
        compile_sql92("TRUE = a").evaluate({"a": "true"})


@pytest.mark.parametrize(("expression", "properties", "delivered"), [
    # Double.valueOf's syntax, not Python's float()
    ("a = 1.0", {"a": "1_0"}, False), ("a > 1.0", {"a": "inf"}, False), ("a > 1.0", {"a": "Infinity"}, True),
    ("a < 1.0", {"a": "-Infinity"}, True), ("a = 1.0", {"a": "1d"}, True), ("a = 1.0", {"a": "1.F"}, True),
    ("a = 3.0", {"a": "0x1.8p1"}, True), ("a = 1.0", {"a": "0x1"}, False), ("a = 0.5", {"a": ".5"}, True),
    ("a = 0.5", {"a": "\t0.5\n"}, True), ("a = 0.5", {"a": "\u00a00.5"}, False), ("a = 1.0", {"a": "-NaN"}, False),
    ("a > 1.0", {"a": "1e400"}, True), ("a = 1.0", {"a": "١"}, False),
    # Integer.valueOf's: Unicode decimal digits yes, blanks and underscores no
    ("a = 1", {"a": "١"}, True), ("a = 12", {"a": "1_2"}, False), ("a = 1", {"a": "+"}, False),
    ("a = 2147483647", {"a": "2147483647"}, True), ("a = -2147483648", {"a": "-2147483648"}, True),
    ("a = 1", {"a": "2147483648"}, False),
    # Integer and Long literals meet; Long against a Double literal goes through double
    ("a = 2147483648", {"a": "2147483648"}, True), ("5 = 5.0", {}, True), ("2147483648 > 5", {}, True),
    # -0.0 and NaN follow Double.compareTo, not IEEE comparison
    ("a = -0.5", {"a": "-0.5"}, True), ("a < b", {"a": "-0.0", "b": "0.0"}, True),
    ("a <= b", {"a": "NaN", "b": "Infinity"}, False), ("a >= b", {"a": "NaN", "b": "NaN"}, True),
    # a number literal and a boolean are simply unequal; a negated string or boolean is NULL
    ("1 = TRUE", {}, False), ("1 <> TRUE", {}, True), ("a > -b", {"a": "1", "b": "2"}, False),
    ("-b IS NULL", {"b": "2"}, True),
    # NOT a CONTAINS 'x' is (NOT a) CONTAINS 'x': a Boolean is no string
    ("NOT a CONTAINS 'x'", {"a": "x"}, False), ("'axb' CONTAINS 'x'", {}, True),
    # long chains do not exhaust the stack
    (" OR ".join(f"a = '{i}'" for i in range(3000)), {"a": "2999"}, True),
    (" AND ".join("a IS NOT NULL" for _ in range(3000)), {"a": "1"}, True),
])
def test_java_number_and_type_rules(expression: str, properties: dict[str, str], delivered: bool) -> None:
    assert compile_sql92(expression).matches(properties) is delivered


@pytest.mark.parametrize(("expression", "message", "column"), [
    ("(a = 'x'", "expected ')'", 9),
    ("((a = 'x') OR (b = 'y')", "expected ')'", 24),
    ("a = 'x'))", None, None),  # not an error: the parser stops after the whole expression
    ("a BETWEEN 10 AND 1", "low bound (10) less than or equal to its high bound (1)", 3),
    ("a BETWEEN 1 AND 'x'", "BETWEEN bounds", 3),
    ("a BETWEEN NULL AND 1", "cannot be NULL", 3),
    ("a == 1", "found '='", 4),
    ("a != 1", "unexpected character '!'", 3),
    ("a =< 1", "found '<'", 4),
    ("a LIKE 'x'", None, None),  # not an error either: 'a', then ignored text
    ("a NOT LIKE 'x'", "after NOT", 7),
    ("a IN (1, 2)", "string literal in the IN list", 7),
    ("a IN ()", "string literal in the IN list", 7),
    ("a IN ('x'", "',' or ')'", 10),
    ("'x' IN ('x')", "IN takes a property", 5),
    ("NOT a IN ('x')", "IN takes a property", 7),
    ("a > 'x'", "cannot be compared with '>'", 3),
    ("a > TRUE", "cannot be compared", 3),
    ("NOT a > 1", "cannot be compared", 7),
    ("a = NULL", "NULL cannot be compared", 3),
    ("NULL <> a", "NULL cannot be compared", 6),
    ("TRUE = 1", "TRUE cannot be compared with 1", 6),
    ("a IS 5", "NULL or NOT NULL after IS", 6),
    ("a IS NOT 5", "NULL after IS NOT", 10),
    ("a CONTAINS x", "string literal after CONTAINS", 12),
    ("a = 'x", "unterminated string literal", 5),
    ("a = 1 #", "unexpected character '#'", 7),  # the first token after the expression is read
    ("a = 1 AND", "found the end of the expression", 10),
    ("", "found the end of the expression", 1),
    ("   ", "found the end of the expression", 4),
    ("5", "will not result in a boolean value", 1),
    ("'x' OR a = 1", "will not result in a boolean value", 5),
    ("-a", "will not result in a boolean value", 1),
    ("a > 0.0", "less than 4.9E-324", 5),
    ("a > 1e400", "greater than", 5),
    ("a > 9223372036854775808", "out of the long range", 5),
    ("a = 'x' AND /* open", "unexpected character '/'", 13),
])
def test_syntax_errors(expression: str, message: str | None, column: int | None) -> None:
    if message is None:
        assert compile_sql92(expression).ignored_tail
        return
    with pytest.raises(Sql92Error) as info:
        compile_sql92(expression)
    error = info.value
    assert isinstance(error, ValueError)
    assert message in str(error)
    assert f"column {column}" in str(error)
    assert error.position == column - 1 and error.expression == expression
    assert repr(expression) in str(error)


def test_multi_line_errors_name_the_line() -> None:
    with pytest.raises(Sql92Error, match=r"line 2, column 6"):
        compile_sql92("a = 1\nOR (b")


def test_what_the_parser_reads_and_ignores() -> None:
    assert compile_sql92("a = 'x'").ignored_tail == ""
    assert compile_sql92("a = 'x' -- why\n").ignored_tail == ""
    assert compile_sql92("a = 'x' -- no line end").ignored_tail == "-- no line end"
    assert compile_sql92("a = 05").ignored_tail == "5"
    assert compile_sql92("a = 0x10").ignored_tail == "x10"  # no hexadecimal literals
    assert compile_sql92("a = 1 b = 2").ignored_tail == "b = 2"
    assert compile_sql92("a = 1 -- c\n AND b = 2").matches({"a": "1", "b": "3"}) is False
    # the ignored text is not read past its first token, as Java's lexer does not
    assert compile_sql92("a = 1 ) #").ignored_tail == ") #"


def test_keywords_are_case_insensitive_and_property_names_are_not() -> None:
    props = {"a": "5", "A": "x", "Region": "eu", "nulls": "n", "index": "i"}
    forms = ["a between 1 and 9 and A in ('x') and not (a is null) and Region startswith 'e'",
             "a BETWEEN 1 AND 9 AND A IN ('x') AND NOT (a IS NULL) AND Region STARTSWITH 'e'",
             "a BeTwEeN 1 aNd 9 AnD A In ('x') aND NoT (a iS NuLl) And Region StartsWith 'e'"]
    for expression in forms:
        assert compile_sql92(expression).matches(props) is True, expression
    assert compile_sql92("region = 'eu'").matches(props) is False  # 'region' is not 'Region'
    assert compile_sql92("REGION IS NULL").matches(props) is True
    # a word that starts with a keyword is a name; true/false/null in any case are literals
    assert compile_sql92("nulls = 'n' AND index = 'i'").matches(props) is True
    assert compile_sql92("tRuE").matches({}) is True and compile_sql92("fAlSe").matches({}) is False
    # a keyword cannot name a property: 'in' here is the IN keyword
    with pytest.raises(Sql92Error):
        compile_sql92("in = 'x'")
    # identifiers are ASCII: a non-ASCII letter is no identifier
    with pytest.raises(Sql92Error, match="unexpected character 'é'"):
        compile_sql92("é = 'x'")
    # the exponent and the long suffix are case-insensitive too
    assert compile_sql92("a = 5E0 AND a = 5e0 AND a = 5L AND a = 5l").matches(props) is True


def test_a_compiled_filter_is_reusable() -> None:
    sql = compile_sql92("a = 'x' OR b > 1")
    assert [sql.matches(p) for p in ({"a": "x"}, {"b": "2"}, {"b": "0"}, {})] == [True, True, False, False]
    assert str(sql) == "((a == 'x') OR (b > 1))"
    assert repr(sql) == "Sql92Filter(\"a = 'x' OR b > 1\")"
