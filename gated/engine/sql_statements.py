"""SQL statements as a gate reads them: each statement's verb, and whether a WHERE clause
of its own limits the rows it touches.

Why (docs/learning.md, "SQL statements"): ``delete from orders_9;`` and ``DELETE FROM
orders WHERE id = 4`` share every word but the WHERE; a linear model learns from the
features a call has, never from one it lacks, so "no WHERE" must be a feature of its own,
and "every row of a table changes" (an unlimited DELETE or UPDATE, a TRUNCATE) one that
a statement written another way still shares. Not a parser: statements are split at
``;`` and read word by word, parentheses tracked only to skip subqueries and common
table expressions; what each kind of statement means is learned.
"""

from __future__ import annotations

import re

#: At most this many statements of one argument are read (a hostile 64 KiB argument of
#: semicolons costs a bounded amount).
MAX_STATEMENTS = 256
#: The verbs a SQL statement starts with (after a ``WITH ...`` common table expression).
SQL_VERBS = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE", "MERGE", "REPLACE", "UPSERT",
                       "DROP", "TRUNCATE", "ALTER", "CREATE", "RENAME", "GRANT", "REVOKE",
                       "COPY", "VACUUM", "ATTACH", "DETACH", "PRAGMA", "EXEC", "CALL"})
#: The verbs that change or remove a table's rows; a WHERE clause limits which (TRUNCATE:
#: every row, always).
SQL_ROW_CHANGES = frozenset({"UPDATE", "DELETE", "MERGE", "TRUNCATE"})
_SQL_TOKEN = re.compile(r"[A-Za-z_]+|[()]")


def sql_statements(text: str) -> list[tuple[str, str]]:
    """(VERB, ``where`` | ``all``) of each statement of `text` that starts with a SQL verb
    (`SQL_VERBS`, case-insensitive; after ``WITH``, the first verb outside the common
    table expressions' parentheses; statements split at ``;``), or [] when `text` is not
    SQL: what a statement does and whether a WHERE clause of its own (not a subquery's)
    limits it."""
    out = []
    for statement in text.split(";", MAX_STATEMENTS)[:MAX_STATEMENTS]:
        depth, top = 0, []  # the statement's words outside parentheses
        for token in _SQL_TOKEN.findall(statement):
            depth = max(0, depth + (token == "(") - (token == ")"))
            if depth == 0 and token not in "()":
                top.append(token.upper())
        if top[:1] == ["WITH"]:
            top = top[next((i for i, w in enumerate(top) if w in SQL_VERBS), len(top)):]
        if top and top[0] in SQL_VERBS:
            out.append((top[0], "where" if "WHERE" in top else "all"))
    return out
