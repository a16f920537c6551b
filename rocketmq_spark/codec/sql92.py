"""Apache RocketMQ's SQL92 message filter: parsed once, evaluated per message as a 5.x broker does.

A consumer subscribes with expressionType ``SQL92`` and a broker with ``enablePropertyFilter=true``
delivers a message only when the expression evaluates to TRUE over the message's properties (the
whole stored map: user properties and the system ones such as ``TAGS``, ``KEYS``, ``UNIQ_KEY``,
``WAIT`` and the ``CLUSTER`` the broker adds on a send). This module gives the same answer as the
Java ``filter`` module of Apache RocketMQ 5.x (its classes are the same from 5.3.3 to 5.5.0), whose
rules are not those of ANSI SQL and are kept here on purpose:

* Three-valued logic: a missing property is NULL, a comparison with NULL is UNKNOWN, and only
  TRUE delivers. ``AND``/``OR`` evaluate left to right and stop at the first FALSE/TRUE. One
  asymmetry: ``=`` with NULL on its right side only is FALSE, so ``'x' <> a`` is TRUE when a is
  missing while ``a <> 'x'`` is UNKNOWN.
* ``=`` and ``<>`` compare a property (always a string) with a number literal as numbers: the
  string is parsed as Java's ``Integer.valueOf`` (for a literal in int range), ``Long.valueOf``
  (a larger one) or ``Double.valueOf`` (a literal with a dot or exponent); with a string literal
  they compare strings. ``x = TRUE`` is true when x is "true" in any case.
* ``>``, ``>=``, ``<``, ``<=`` take number literals only (a string or boolean literal is a syntax
  error); two properties are compared as doubles, never as strings.
* A value that cannot be parsed as the number it is compared with makes the evaluation fail; the
  broker then drops the message (even under ``<>`` or ``NOT``), and so does :meth:`Sql92Filter.matches`.
* ``NOT`` binds tighter than comparisons: ``NOT a = 'x'`` is ``(NOT a) = 'x'`` (never true);
  write ``NOT (a = 'x')``. A property used as a condition (``a``, ``NOT a``) is FALSE when present.
* ``IN`` lists hold string literals only and compare strings; ``CONTAINS``, ``STARTSWITH``,
  ``ENDSWITH`` (and their ``NOT`` forms) are FALSE, not UNKNOWN, on a missing property or an empty
  search string.
* The parser stops at the first token that cannot continue the expression and ignores the rest:
  ``a = 05`` is ``a = 0``, ``a LIKE 'x'`` is ``a``, and ``a = 1)`` is ``a = 1``
  (:attr:`Sql92Filter.ignored_tail` holds what was ignored).

Keywords (``AND``, ``OR``, ``NOT``, ``BETWEEN``, ``IN``, ``IS``, ``NULL``, ``TRUE``, ``FALSE``,
``CONTAINS``, ``STARTSWITH``, ``ENDSWITH``) are case-insensitive; property names are ASCII
identifiers (``[A-Za-z_$][A-Za-z0-9_$]*``) and case-sensitive.
"""

from __future__ import annotations

import logging
import re
import struct
import unicodedata
from collections.abc import Callable, Mapping
from typing import NamedTuple

__all__ = ["Sql92Error", "Sql92EvaluationError", "Sql92Filter", "compile_sql92"]

log = logging.getLogger(__name__)


class Sql92Error(ValueError):
    """An expression Apache RocketMQ's SQL92 parser refuses (a broker answers the subscription
    with SUBSCRIPTION_PARSE_FAILED). ``position`` is the 0-based offset of the offending token
    in ``expression`` (None when the error is not at one place), ``token`` its text."""

    def __init__(self, message: str, expression: str, position: int | None = None,
                 token: str | None = None) -> None:
        if position is not None:
            line = expression.count("\n", 0, position) + 1
            column = position - (expression.rfind("\n", 0, position) + 1) + 1
            where = f" at line {line}, column {column}" if "\n" in expression else f" at column {column}"
            message = f"{message}{where}"
        super().__init__(f"invalid SQL92 filter {expression!r}: {message}")
        self.expression = expression
        self.position = position
        self.token = token


class Sql92EvaluationError(Exception):
    """The evaluation of a compiled filter failed on one message (a property that is not the
    number it is compared with, a boolean compared with a string): the broker drops the message."""


# ---------------------------------------------------------------------------------------------
# Values. A property is a str, a missing one None; literals are Java Integer, Long, Double,
# Boolean or String, and Java converts between them by class, so the two integer classes differ.


class _JInt(int):
    """A java.lang.Integer (a decimal literal in int range, or its negation)."""

    __slots__ = ()


class _JLong(int):
    """A java.lang.Long (a decimal literal beyond int range, or its negation)."""

    __slots__ = ()


_Value = None | bool | int | float | str

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_DOUBLE_MAX = 1.7976931348623157e308
_DOUBLE_MIN = 5e-324  # Double.MIN_VALUE, the smallest positive double


def _java_trim(s: str) -> str:
    """String.trim(): strips every char up to U+0020 from both ends (and nothing else)."""
    start, end = 0, len(s)
    while start < end and s[start] <= " ":
        start += 1
    while end > start and s[end - 1] <= " ":
        end -= 1
    return s[start:end]


def _parse_java_int(s: str, bits: int) -> _JInt | _JLong:
    """Integer.valueOf / Long.valueOf of a string: optional sign, decimal digits (any Unicode
    decimal digit of the BMP, as Character.digit takes), no blanks, in range, else a failure."""
    digits, negative = s, False
    if digits[:1] in ("+", "-"):
        negative, digits = digits[0] == "-", digits[1:]
    if not digits:
        raise Sql92EvaluationError(f"NumberFormatException: For input string: {s!r}")
    limit = 2 ** (bits - 1)
    value = 0
    for ch in digits:
        digit = ord(ch) - 48 if "0" <= ch <= "9" else (
            unicodedata.decimal(ch, None) if ord(ch) <= 0xFFFF else None)
        if digit is None:
            raise Sql92EvaluationError(f"NumberFormatException: For input string: {s!r}")
        value = value * 10 + digit
        if value > limit:
            raise Sql92EvaluationError(f"NumberFormatException: For input string: {s!r}")
    if negative:
        value = -value
    if not -limit <= value <= limit - 1:
        raise Sql92EvaluationError(f"NumberFormatException: For input string: {s!r}")
    return _JInt(value) if bits == 32 else _JLong(value)


_JAVA_DECIMAL_FLOAT = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)", re.ASCII)
_JAVA_HEX_FLOAT = re.compile(
    r"[+-]?0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?[0-9]+[fFdD]?", re.ASCII)


def _parse_java_double(s: str) -> float:
    """Double.valueOf of a string: trimmed, Java's decimal or hexadecimal floating-point syntax
    (``1``, ``1.5``, ``.5``, ``5.``, ``1e3``, ``NaN``, ``-Infinity``, ``0x1.8p1``, an f/d suffix).
    Python's float() takes more (``inf``, ``1_0``, Unicode digits, blanks inside), hence the check."""
    text = _java_trim(s)
    if _JAVA_DECIMAL_FLOAT.fullmatch(text):
        return float(text.rstrip("fFdD"))
    if _JAVA_HEX_FLOAT.fullmatch(text):
        body = text.rstrip("fFdD")
        try:
            return float.fromhex(body)
        except OverflowError:
            return float("-inf") if body.startswith("-") else float("inf")
    raise Sql92EvaluationError(f"NumberFormatException: For input string: {s!r}")


def _double_bits(x: float) -> int:
    """Double.doubleToLongBits (every NaN is the canonical one), as a signed long."""
    if x != x:
        return 0x7FF8000000000000
    return int(struct.unpack(">q", struct.pack(">d", x))[0])


def _compare_doubles(a: float, b: float) -> int:
    """Double.compareTo: -0.0 < 0.0, and NaN equals itself and is above +Infinity."""
    if a < b:
        return -1
    if a > b:
        return 1
    ab, bb = _double_bits(a), _double_bits(b)
    return (ab > bb) - (ab < bb)


def _compare_same(lv: _Value, rv: _Value) -> int:
    """compareTo of two values of one Java class."""
    if isinstance(lv, float) and isinstance(rv, float):
        return _compare_doubles(lv, rv)
    if isinstance(lv, str) and isinstance(rv, str):
        # String.compareTo orders UTF-16 code units, not code points
        lu, ru = lv.encode("utf-16-be", "surrogatepass"), rv.encode("utf-16-be", "surrogatepass")
        return (lu > ru) - (lu < ru)
    return (lv > rv) - (lv < rv)  # type: ignore[operator]  # two ints or two bools


def _compare(lv: _Value, rv: _Value) -> int:
    """ComparisonExpression.__compare with string conversion on (the parser always turns it on):
    values of different classes are converted towards the right-hand class (Integer -> Long ->
    Double; a String to the class of the number or boolean it meets), or are simply unequal (-1)."""
    lt, rt = type(lv), type(rv)
    if lt is not rt:
        if lt is bool:
            if rt is str:
                # Java casts the Boolean itself to String here
                raise Sql92EvaluationError("ClassCastException: a Boolean compared with a String")
            return -1
        if lt is _JInt:
            if rt is _JLong:
                lv = _JLong(lv)  # type: ignore[arg-type]
            elif rt is float:
                lv = float(lv)  # type: ignore[arg-type]
            elif rt is str:
                rv = _parse_java_int(rv, 32)  # type: ignore[arg-type]
            else:
                return -1
        elif lt is _JLong:
            if rt is _JInt:
                rv = _JLong(rv)  # type: ignore[arg-type]
            elif rt is float:
                lv = float(lv)  # type: ignore[arg-type]
            elif rt is str:
                rv = _parse_java_int(rv, 64)  # type: ignore[arg-type]
            else:
                return -1
        elif lt is float:
            if rt is _JInt or rt is _JLong:
                rv = float(rv)  # type: ignore[arg-type]
            elif rt is str:
                rv = _parse_java_double(rv)  # type: ignore[arg-type]
            else:
                return -1
        elif lt is str:
            if rt is bool:
                lv = lv.lower() == "true" and lv.isascii()  # type: ignore[union-attr]  # Boolean.valueOf
            elif rt is _JInt:
                lv = _parse_java_int(lv, 32)  # type: ignore[arg-type]
            elif rt is _JLong:
                lv = _parse_java_int(lv, 64)  # type: ignore[arg-type]
            elif rt is float:
                lv = _parse_java_double(lv)  # type: ignore[arg-type]
            else:
                return -1
        else:
            return -1
    return _compare_same(lv, rv)


def _is_number(v: _Value) -> bool:
    return type(v) in (_JInt, _JLong, float)


def _literal_text(v: _Value) -> str:
    """How a value reads in an expression (for messages)."""
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v) if isinstance(v, float) else str(int(v))


# ---------------------------------------------------------------------------------------------
# The expression tree. ``boolean`` says whether Java's node is a BooleanExpression, which
# decides what the parser accepts where (AND/OR/NOT operands, comparison operands).

_Props = Mapping[str, str]


class _Node:
    boolean = False

    def eval(self, props: _Props) -> _Value:
        raise NotImplementedError


class _Const(_Node):
    def __init__(self, value: _Value, boolean_constant: bool = False) -> None:
        self.value = value
        self.boolean = boolean_constant  # TRUE, FALSE and NULL are BooleanConstantExpressions

    def eval(self, props: _Props) -> _Value:
        return self.value

    def __str__(self) -> str:
        return _literal_text(self.value)


class _Prop(_Node):
    def __init__(self, name: str) -> None:
        self.name = name

    def eval(self, props: _Props) -> _Value:
        return props.get(self.name)

    def __str__(self) -> str:
        return self.name


class _Negate(_Node):
    def __init__(self, operand: _Node) -> None:
        self.operand = operand

    def eval(self, props: _Props) -> _Value:
        v = self.operand.eval(props)
        t = type(v)
        if t is _JInt:
            return _JInt(-v)  # type: ignore[operator]
        if t is _JLong:
            return _JLong(-v)  # type: ignore[operator]
        if t is float:
            return -v  # type: ignore[operator]
        return None  # NULL, and a string or boolean is no number

    def __str__(self) -> str:
        return f"(- {self.operand})"


class _Not(_Node):
    boolean = True

    def __init__(self, operand: _Node) -> None:
        self.operand = operand

    def eval(self, props: _Props) -> _Value:
        v = self.operand.eval(props)
        return None if v is None else not v

    def __str__(self) -> str:
        return f"(NOT {self.operand})"


class _BoolCast(_Node):
    """A property used as a condition: TRUE only for a Boolean value, which a property never is."""

    boolean = True

    def __init__(self, operand: _Node) -> None:
        self.operand = operand

    def eval(self, props: _Props) -> _Value:
        v = self.operand.eval(props)
        if v is None:
            return None
        return v if type(v) is bool else False

    def __str__(self) -> str:
        return str(self.operand)


class _Junction(_Node):
    """AND (``decides`` FALSE) and OR (``decides`` TRUE). Java nests them two by two, left
    first; folding the operands in that order is the same (the first operand equal to
    ``decides`` ends it, otherwise any UNKNOWN makes it UNKNOWN) and keeps a long chain off the
    Python stack."""

    boolean = True
    operands: list[_Node]
    decides: bool
    word: str

    def __init__(self, left: _Node, right: _Node) -> None:
        kind = type(self)
        self.operands = [*(left.operands if isinstance(left, kind) else [left]),
                         *(right.operands if isinstance(right, kind) else [right])]

    def eval(self, props: _Props) -> _Value:
        unknown = False
        for operand in self.operands:
            v = operand.eval(props)
            if v is None:
                unknown = True
            elif bool(v) is self.decides:
                return self.decides
        return None if unknown else not self.decides

    def __str__(self) -> str:
        return "(" + f" {self.word} ".join(map(str, self.operands)) + ")"


class _And(_Junction):
    decides, word = False, "AND"


class _Or(_Junction):
    decides, word = True, "OR"


class _Equal(_Node):
    """``=`` (and IS NULL, which is an equality with the NULL constant): NULL on the left gives
    UNKNOWN, NULL on the right only gives FALSE; two NULLs are equal."""

    boolean = True

    def __init__(self, left: _Node, right: _Node) -> None:
        self.left, self.right = left, right

    def eval(self, props: _Props) -> _Value:
        lv, rv = self.left.eval(props), self.right.eval(props)
        if lv is None or rv is None:
            if lv is None and rv is None:
                return True
            return None if lv is None else False
        # Java tries equals() before compareTo(); for values of one class they agree, and
        # for two classes equals() is false
        return _compare(lv, rv) == 0

    def __str__(self) -> str:
        return f"({self.left} == {self.right})"


_ORDERINGS: dict[str, Callable[[int], bool]] = {
    ">": lambda c: c > 0, ">=": lambda c: c >= 0, "<": lambda c: c < 0, "<=": lambda c: c <= 0}


class _Ordering(_Node):
    """``>``, ``>=``, ``<``, ``<=``: UNKNOWN on a NULL; two strings (two properties) compare as
    doubles, and fail when either is not one."""

    boolean = True

    def __init__(self, op: str, left: _Node, right: _Node) -> None:
        self.op, self.left, self.right = op, left, right
        self.test = _ORDERINGS[op]

    def eval(self, props: _Props) -> _Value:
        lv = self.left.eval(props)
        if lv is None:
            return None
        rv = self.right.eval(props)
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:
            lv, rv = _parse_java_double(lv), _parse_java_double(rv)
        return self.test(_compare(lv, rv))

    def __str__(self) -> str:
        return f"({self.left} {self.op} {self.right})"


class _In(_Node):
    boolean = True

    def __init__(self, prop: _Prop, values: list[str], negated: bool) -> None:
        self.prop, self.values, self.negated = prop, frozenset(values), negated
        self._text = f"{prop} {'NOT IN' if negated else 'IN'} ({', '.join(map(_literal_text, values))})"

    def eval(self, props: _Props) -> _Value:
        v = self.prop.eval(props)
        if type(v) is not str:
            return None
        return (v in self.values) != self.negated

    def __str__(self) -> str:
        return self._text


_STRING_TESTS: dict[str, Callable[[str, str], bool]] = {
    "CONTAINS": lambda v, s: s in v, "STARTSWITH": str.startswith, "ENDSWITH": str.endswith}


class _StringTest(_Node):
    """CONTAINS / STARTSWITH / ENDSWITH and their NOT forms: FALSE (never UNKNOWN) on an empty
    search string, a NULL or a value that is not a string."""

    boolean = True

    def __init__(self, op: str, operand: _Node, search: str, negated: bool) -> None:
        self.op, self.operand, self.search, self.negated = op, operand, search, negated
        self.test = _STRING_TESTS[op]

    def eval(self, props: _Props) -> _Value:
        if not self.search:
            return False
        v = self.operand.eval(props)
        if type(v) is not str:
            return False
        return self.test(v, self.search) != self.negated

    def __str__(self) -> str:
        return f"({self.operand} {'NOT ' if self.negated else ''}{self.op} {_literal_text(self.search)})"


# ---------------------------------------------------------------------------------------------
# Lexer: longest match at each place, a keyword winning over an identifier of the same length;
# tokens are read only as far as the parser looks, so text after the expression is not read.


class _Token(NamedTuple):
    kind: str  # a keyword, DECIMAL, FLOAT, STRING, ID, an operator, or EOF
    text: str
    pos: int


_KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS",
                       "CONTAINS", "STARTSWITH", "ENDSWITH"})
_SKIPPED = [
    re.compile(r"[ \t\n\r\f]"),
    re.compile(r"--[^\n\r]*(?:\r\n|\r|\n)"),  # a line comment needs its line end
    re.compile(r"/\*[^*]*\*(?:\*|[^*/][^*]*\*)*/"),
]
_TOKENS = [  # in Java's order of kinds: the earlier wins a tie
    ("WORD", re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")),
    ("DECIMAL", re.compile(r"0|[1-9][0-9]*[lL]?")),
    ("FLOAT", re.compile(r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?")),
    ("FLOAT", re.compile(r"\.[0-9]+(?:[eE][+-]?[0-9]+)?")),
    ("FLOAT", re.compile(r"[0-9]+[eE][+-]?[0-9]+")),
    ("STRING", re.compile(r"'(?:''|[^'])*'")),
    ("OP", re.compile(r"<>|<=|>=|[=<>(),+-]")),
]


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def next(self) -> _Token:
        text = self.text
        while True:
            pos = self.pos
            if pos >= len(text):
                return _Token("EOF", "", pos)
            best_len, best_kind = 0, ""
            for pattern in _SKIPPED:
                m = pattern.match(text, pos)
                if m and m.end() - pos > best_len:
                    best_len, best_kind = m.end() - pos, "SKIP"
            for kind, pattern in _TOKENS:
                m = pattern.match(text, pos)
                if m and m.end() - pos > best_len:
                    best_len, best_kind = m.end() - pos, kind
            if not best_len:
                what = "unterminated string literal" if text[pos] == "'" else f"unexpected character {text[pos]!r}"
                raise Sql92Error(what, text, pos, text[pos])
            self.pos = pos + best_len
            if best_kind == "SKIP":
                continue
            image = text[pos:pos + best_len]
            if best_kind == "WORD":
                upper = image.upper()
                best_kind = upper if upper in _KEYWORDS else "ID"
            elif best_kind == "OP":
                best_kind = image
            return _Token(best_kind, image, pos)


# ---------------------------------------------------------------------------------------------
# Parser: the grammar of Apache RocketMQ's SelectorParser, precedence from loose to tight:
#   or:         and (OR and)*
#   and:        equality (AND equality)*
#   equality:   comparison ( '=' comparison | '<>' comparison | IS NULL | IS NOT NULL )*
#   comparison: unary ( ('>'|'>='|'<'|'<=') unary | [NOT] (CONTAINS|STARTSWITH|ENDSWITH) string
#                       | [NOT] BETWEEN unary AND unary | [NOT] IN '(' string (',' string)* ')' )*
#   unary:      '+' unary | '-' unary | NOT unary | primary
#   primary:    literal | identifier | '(' or ')'
# and nothing requires the end of the text after the expression.


def _describe(tok: _Token) -> str:
    return "the end of the expression" if tok.kind == "EOF" else repr(tok.text)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.lexer = _Lexer(text)
        self.tokens: list[_Token] = []

    def peek(self, ahead: int = 0) -> _Token:
        while len(self.tokens) <= ahead:
            self.tokens.append(self.lexer.next())
        return self.tokens[ahead]

    def take(self) -> _Token:
        tok = self.peek()
        del self.tokens[0]
        return tok

    def expect(self, kind: str, what: str) -> _Token:
        tok = self.peek()
        if tok.kind != kind:
            raise self.error(f"expected {what}, found {_describe(tok)}", tok)
        return self.take()

    def error(self, message: str, tok: _Token) -> Sql92Error:
        return Sql92Error(message, self.text, tok.pos, tok.text or None)

    # -- the checks Java makes when it builds a node ----------------------------------------

    def as_condition(self, node: _Node, at: _Token) -> _Node:
        if node.boolean:
            return node
        if isinstance(node, _Prop):
            return _BoolCast(node)
        raise self.error(f"expression {node} will not result in a boolean value", at)

    def ordering(self, op: _Token, left: _Node, right: _Node) -> _Node:
        for side in (left, right):
            if (isinstance(side, _Const) and not _is_number(side.value)) or side.boolean:
                raise self.error(f"value {side} cannot be compared with {op.text!r} (it takes numbers)", op)
        return _Ordering(op.text, left, right)

    def equal(self, op: _Token, left: _Node, right: _Node) -> _Node:
        for side in (left, right):
            if isinstance(side, _Const) and side.value is None:
                raise self.error(f"NULL cannot be compared with {op.text!r} (use IS NULL / IS NOT NULL)", op)
        if isinstance(left, _Const) and isinstance(right, _Const) and left.boolean and not right.boolean:
            raise self.error(f"{left} cannot be compared with {right}", op)
        return _Equal(left, right)

    def between(self, op: _Token, value: _Node, low: _Node, high: _Node) -> _Node:
        # only literal bounds are checked: a negated one (-5) is an expression to Java
        if isinstance(low, _Const) and isinstance(high, _Const):
            if low.value is None or high.value is None:
                raise self.error("BETWEEN bounds cannot be NULL", op)
            try:
                reversed_bounds = _compare(high.value, low.value) < 0
            except Sql92EvaluationError as e:
                raise self.error(f"BETWEEN bounds {low} and {high} cannot be compared ({e})", op) from None
            if reversed_bounds:
                raise self.error(f"BETWEEN needs its low bound ({low}) less than or equal to its high "
                                 f"bound ({high})", op)
        ge, le = _Token(">=", ">=", op.pos), _Token("<=", "<=", op.pos)
        return _And(self.ordering(ge, value, low), self.ordering(le, value, high))

    # -- grammar ----------------------------------------------------------------------------

    def selector(self) -> _Node:
        first = self.peek()
        return self.as_condition(self.or_expr(), first)

    def or_expr(self) -> _Node:
        left = self.and_expr()
        while self.peek().kind == "OR":
            op = self.take()
            right = self.and_expr()
            left = _Or(self.as_condition(left, op), self.as_condition(right, op))
        return left

    def and_expr(self) -> _Node:
        left = self.equality()
        while self.peek().kind == "AND":
            op = self.take()
            right = self.equality()
            left = _And(self.as_condition(left, op), self.as_condition(right, op))
        return left

    def equality(self) -> _Node:
        left = self.comparison()
        while True:
            tok = self.peek()
            if tok.kind == "=":
                self.take()
                left = self.equal(tok, left, self.comparison())
            elif tok.kind == "<>":
                self.take()
                left = _Not(self.equal(tok, left, self.comparison()))
            elif tok.kind == "IS":
                self.take()
                if self.peek().kind == "NULL":
                    self.take()
                    left = _Equal(left, _Const(None, True))
                else:
                    self.expect("NOT", "NULL or NOT NULL after IS")
                    self.expect("NULL", "NULL after IS NOT")
                    left = _Not(_Equal(left, _Const(None, True)))
            else:
                return left

    def comparison(self) -> _Node:
        left = self.unary()
        while True:
            tok = self.peek()
            kind = tok.kind
            if kind in _ORDERINGS:
                self.take()
                left = self.ordering(tok, left, self.unary())
                continue
            negated = kind == "NOT"
            if negated:
                kind = self.peek(1).kind
                if kind not in ("CONTAINS", "STARTSWITH", "ENDSWITH", "BETWEEN", "IN"):
                    raise self.error("expected CONTAINS, STARTSWITH, ENDSWITH, BETWEEN or IN after NOT, "
                                     f"found {_describe(self.peek(1))}", self.peek(1))
                self.take()
            if kind in _STRING_TESTS:
                self.take()
                search = self.string_literal(f"a string literal after {kind}")
                left = _StringTest(kind, left, search, negated)
            elif kind == "BETWEEN":
                op = self.take()
                low = self.unary()
                self.expect("AND", "AND between the bounds of BETWEEN")
                high = self.unary()
                if negated:
                    lt, gt = _Token("<", "<", op.pos), _Token(">", ">", op.pos)
                    left = _Or(self.ordering(lt, left, low), self.ordering(gt, left, high))
                else:
                    left = self.between(op, left, low, high)
            elif kind == "IN":
                op = self.take()
                self.expect("(", "'(' after IN")
                values = [self.string_literal("a string literal in the IN list")]
                while self.peek().kind == ",":
                    self.take()
                    values.append(self.string_literal("a string literal in the IN list"))
                self.expect(")", "',' or ')' in the IN list")
                if not isinstance(left, _Prop):
                    raise self.error(f"IN takes a property on its left, not {left}", op)
                left = _In(left, values, negated)
            else:
                return left

    def unary(self) -> _Node:
        tok = self.peek()
        if tok.kind == "+":
            self.take()
            return self.unary()
        if tok.kind == "-":
            self.take()
            return _Negate(self.unary())
        if tok.kind == "NOT":
            self.take()
            return _Not(self.as_condition(self.unary(), tok))
        return self.primary()

    def primary(self) -> _Node:
        tok = self.peek()
        kind = tok.kind
        if kind == "ID":
            self.take()
            return _Prop(tok.text)
        if kind == "(":
            self.take()
            inner = self.or_expr()
            self.expect(")", f"')' to close the '(' at character {tok.pos + 1}")
            return inner
        if kind == "STRING":
            return _Const(self.string_literal("a string"))
        if kind in ("TRUE", "FALSE", "NULL"):
            self.take()
            return _Const({"TRUE": True, "FALSE": False, "NULL": None}[kind], True)
        if kind == "DECIMAL":
            self.take()
            digits = tok.text.rstrip("lL")
            value = int(digits)
            if value > _LONG_MAX:
                raise self.error(f"integer literal {tok.text} is out of the long range", tok)
            return _Const(_JInt(value) if value <= _INT_MAX else _JLong(value))
        if kind == "FLOAT":
            self.take()
            number = float(tok.text)
            if number > _DOUBLE_MAX:
                raise self.error(f"{tok.text} is greater than {_DOUBLE_MAX!r}", tok)
            if number < _DOUBLE_MIN:  # zero too: Java compares with the smallest positive double
                raise self.error(f"{tok.text} is less than 4.9E-324", tok)
            return _Const(number)
        raise self.error(f"expected a property, a literal or '(', found {_describe(tok)}", tok)

    def string_literal(self, what: str) -> str:
        return self.expect("STRING", what).text[1:-1].replace("''", "'")


# ---------------------------------------------------------------------------------------------


class Sql92Filter:
    """A compiled SQL92 filter. ``expression`` is the text it was compiled from;
    ``ignored_tail`` is the text after the expression that Java's parser ignores ('' when it
    read the whole text)."""

    __slots__ = ("expression", "ignored_tail", "_root")

    def __init__(self, expression: str, root: _Node, ignored_tail: str) -> None:
        self.expression = expression
        self.ignored_tail = ignored_tail
        self._root = root

    def evaluate(self, properties: Mapping[str, str]) -> bool | None:
        """True, False or None (UNKNOWN) over a message's ``properties``; raises
        :class:`Sql92EvaluationError` where Java's evaluation throws."""
        try:
            result = self._root.eval(properties)
        except RecursionError:
            raise Sql92EvaluationError("expression nested too deeply to evaluate") from None
        return result if isinstance(result, bool) else None

    def matches(self, properties: Mapping[str, str]) -> bool:
        """Whether a broker delivers the message whose properties (the whole stored map, values
        as strings) are ``properties``: only when the filter evaluates to TRUE; UNKNOWN and a
        failed evaluation drop the message."""
        try:
            return self.evaluate(properties) is True
        except Sql92EvaluationError as e:
            log.debug("SQL92 filter %r failed on %r: %s", self.expression, properties, e)
            return False

    def __repr__(self) -> str:
        return f"Sql92Filter({self.expression!r})"

    def __str__(self) -> str:
        return str(self._root)


def compile_sql92(expression: str) -> Sql92Filter:
    """Parse ``expression`` as Apache RocketMQ's broker does; raise :class:`Sql92Error` for what
    its parser refuses (syntax, a non-boolean condition, a string or boolean literal under
    ``<``/``>``, NULL under ``=``, literal BETWEEN bounds in the wrong order, a literal out of
    range, a zero or infinite float literal)."""
    parser = _Parser(expression)
    try:
        root = parser.selector()
        nxt = parser.peek()
    except RecursionError:
        raise Sql92Error("expression nested too deeply", expression) from None
    tail = "" if nxt.kind == "EOF" else expression[nxt.pos:]
    return Sql92Filter(expression, root, tail)
