"""SQL92 filter cases, (expression, message properties, delivered?), shared by the unit tests of
rocketmq_spark.codec.sql92 and by any test that runs them against a broker.

Every expected value was derived by reading Apache RocketMQ's filter module (the same classes in
5.3.3 and 5.5.0: filter/src/main/java/org/apache/rocketmq/filter/) and the broker's
ExpressionMessageFilter, which delivers a message only when the expression evaluates to
Boolean.TRUE and drops it when evaluation returns NULL (UNKNOWN) or throws. The comment on a row
names the Java rule that decides it.

Every expression here compiles on a 5.5.0 broker (the syntax errors are in the unit test), every
property name is a plain user property (none of MessageConst's system names, so a Java producer's
putUserProperty takes it) and every value is a non-blank string. A broker also shows the filter
its system properties (WAIT, UNIQ_KEY, CLUSTER, TAGS, KEYS...): no row depends on them.
"""

from __future__ import annotations

SQL92_CASES: list[tuple[str, dict[str, str], bool]] = [
    # --- equality with strings, and NULL (a missing property) -------------------------------
    ("a = 'x'", {"a": "x"}, True),
    ("a = 'x'", {"a": "y"}, False),
    ("a = 'x'", {"a": "X"}, False),  # String.equals: case-sensitive
    ("a = 'x'", {}, False),  # doCreateEqual: NULL on the left -> UNKNOWN -> not delivered
    ("a <> 'x'", {"a": "y"}, True),
    ("a <> 'x'", {}, False),  # NOT(UNKNOWN) is UNKNOWN
    # doCreateEqual is asymmetric: a NULL on the right gives FALSE (not UNKNOWN), so NOT gives TRUE
    ("'x' <> a", {}, True),
    ("'x' = a", {}, False),
    ("a = b", {"a": "1.0", "b": "1"}, False),  # two properties: String.equals, no number parsing
    ("a = 'it''s'", {"a": "it's"}, True),  # '' inside a string literal is one quote
    ("a = 'é'", {"a": "é"}, True),
    # --- a property (a string) against a number literal: ComparisonExpression.__compare ----
    # converts the string to the literal's class: Integer.valueOf for an int literal
    ("a > 5", {"a": "10"}, True),  # numeric: 10 > 5 (as strings '10' < '5')
    ("a < 5", {"a": "10"}, False),
    ("a > 5", {"a": "5"}, False),
    ("a >= 5", {"a": "5"}, True),
    ("a = 5", {"a": "5"}, True),
    ("a = 5", {"a": "05"}, True),  # Integer.valueOf("05") = 5
    ("a > 5", {"a": "+7"}, True),  # Integer.valueOf takes a '+' sign
    ("a = '5'", {"a": "05"}, False),  # string literal: string equality
    ("a = 5", {"a": "5.0"}, False),  # Integer.valueOf("5.0") throws -> evaluation fails -> dropped
    ("a > 5", {"a": "5.5"}, False),  # same: an int literal needs an integer string
    ("a > 5", {"a": "abc"}, False),  # NumberFormatException -> dropped
    ("a <= 5", {"a": "abc"}, False),  # ... whichever way the comparison goes
    ("a <> 5", {"a": "abc"}, False),  # the '=' under '<>' throws: dropped, not delivered
    ("a <> '5'", {"a": "abc"}, True),  # string literal: plain string inequality
    ("a > 5", {"a": " 7"}, False),  # Integer.valueOf does not trim -> throws
    ("a > 5", {"a": "3000000000"}, False),  # beyond int: Integer.valueOf throws
    ("a > 2147483648", {"a": "3000000000"}, True),  # a literal beyond int is a Long: Long.valueOf
    # a literal with a dot or exponent is a Double: Double.valueOf (trims, takes 5, NaN, 1e1)
    ("a > 5.0", {"a": "5.5"}, True),
    ("a = 5.0", {"a": "5"}, True),
    ("a > 5.0", {"a": " 7 "}, True),  # Double.valueOf trims
    ("a = 1.5e2", {"a": "150"}, True),
    ("a > 1.5", {"a": "NaN"}, True),  # Double.compareTo puts NaN above every number
    ("a > -5", {"a": "-3"}, True),  # unary minus on a literal
    ("a = 05", {"a": "5"}, False),  # '05' lexes as 0 then 5; the parser stops after 'a = 0'
    ("a = 05", {"a": "0"}, True),
    # two properties under < > <= >=: both parsed with Double.valueOf, never compared as text
    ("a < b", {"a": "9", "b": "10"}, True),
    ("a < b", {"a": "apple", "b": "banana"}, False),  # not numbers: throws -> dropped
    # --- BETWEEN (= a >= low AND a <= high) and NOT BETWEEN (= a < low OR a > high) ---------
    ("a BETWEEN 1 AND 10", {"a": "10"}, True),
    ("a BETWEEN 1 AND 10", {"a": "11"}, False),
    ("a BETWEEN 1 AND 10", {}, False),
    ("a NOT BETWEEN 1 AND 10", {"a": "11"}, True),
    ("a NOT BETWEEN 1 AND 10", {}, False),  # UNKNOWN OR UNKNOWN
    ("a NOT BETWEEN 10 AND 1", {"a": "5"}, True),  # createNotBetween checks no bound order: 5 < 10
    # createBetween checks the bound order of literals only; -1 and -10 are negations, so accepted
    ("a BETWEEN -1 AND -10", {"a": "-5"}, False),
    # --- IN: string literals, String.equals membership -------------------------------------
    ("a IN ('x', 'y')", {"a": "y"}, True),
    ("a IN ('x', 'y')", {"a": "z"}, False),
    ("a IN ('5')", {"a": "05"}, False),  # no number parsing in IN
    ("a NOT IN ('x')", {"a": "y"}, True),
    ("a NOT IN ('x')", {}, False),  # UNKNOWN
    # --- IS NULL / IS NOT NULL ----------------------------------------------------------------
    ("a IS NULL", {}, True),
    ("a IS NULL", {"a": "x"}, False),
    ("a IS NOT NULL", {"a": "x"}, True),
    ("a IS NOT NULL", {}, False),
    # --- three-valued AND / OR / NOT, evaluated left to right (LogicExpression) --------------
    ("a > 5 OR b = 'y'", {"b": "y"}, True),  # UNKNOWN OR TRUE = TRUE
    ("a > 5 AND b = 'y'", {"b": "y"}, False),  # UNKNOWN AND TRUE = UNKNOWN
    ("NOT (a > 5)", {}, False),  # NOT UNKNOWN = UNKNOWN
    ("NOT (a > 5) OR a IS NULL", {}, True),
    ("b = 'y' OR a > 5", {"a": "abc", "b": "y"}, True),  # TRUE first: a > 5 is never evaluated
    ("a > 5 OR b = 'y'", {"a": "abc", "b": "y"}, False),  # a > 5 throws first: dropped
    # --- NOT binds tighter than comparisons (unaryExpr): NOT a = 'x' is (NOT a) = 'x' -----
    ("NOT a = 'x'", {"a": "y"}, False),  # Boolean compared with a String: ClassCastException
    ("NOT (a = 'x')", {"a": "y"}, True),
    ("NOT a IS NULL", {}, True),  # (NOT a) IS NULL: NOT of UNKNOWN is NULL
    ("NOT a IS NULL", {"a": "x"}, False),
    # --- a property as a condition: BooleanCast is TRUE only for a Boolean, never a string --
    ("a", {"a": "true"}, False),
    ("NOT a", {"a": "x"}, True),  # NOT FALSE
    ("NOT a", {}, False),
    # --- boolean literals ---------------------------------------------------------------------
    ("a = TRUE", {"a": "true"}, True),  # String vs Boolean: Boolean.valueOf(a)
    ("a = TRUE", {"a": "TRUE"}, True),  # ... which ignores case
    ("a = TRUE", {"a": "1"}, False),
    ("a = FALSE", {"a": "yes"}, True),  # Boolean.valueOf("yes") is false
    ("TRUE = a", {"a": "true"}, False),  # Boolean on the left: ClassCastException -> dropped
    ("TRUE", {}, True),
    ("FALSE", {}, False),
    ("NULL", {}, False),
    # --- CONTAINS / STARTSWITH / ENDSWITH: FALSE (never UNKNOWN) on NULL or '' ---------------
    ("a CONTAINS 'bc'", {"a": "abcd"}, True),
    ("a CONTAINS 'B'", {"a": "abcd"}, False),
    ("a STARTSWITH 'ab'", {"a": "abcd"}, True),
    ("a ENDSWITH 'cd'", {"a": "abcd"}, True),
    ("a NOT ENDSWITH 'cd'", {"a": "abcd"}, False),
    ("a NOT CONTAINS 'x'", {}, False),  # NULL -> FALSE
    ("NOT (a CONTAINS 'x')", {}, True),  # ... so NOT of it is TRUE
    ("a NOT CONTAINS ''", {"a": "abc"}, False),  # an empty search string is FALSE either way
    # --- keywords in any case; property names are case-sensitive ------------------------------
    ("a = 'x' and b = 'y'", {"a": "x", "b": "y"}, True),
    ("a iN ('x') oR b Is NoT nUlL", {"b": "y"}, True),
    ("A = 'x'", {"a": "x"}, False),  # property A is missing
    ("$a_1 = 'x'", {"$a_1": "x"}, True),
    # --- comments, and text after the expression (JmsSelector does not require the end) ----
    ("/* note */ a = 'x'", {"a": "x"}, True),
    ("a = 'x' )", {"a": "x"}, True),  # ')' after a whole expression is ignored
    ("a LIKE 'x%'", {"a": "x"}, False),  # no LIKE: this is the condition 'a' (FALSE), rest ignored
]
