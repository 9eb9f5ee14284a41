# A --check-python module that does not compile (a SyntaxError at import).


def check(root):
    return True


return check  # noqa: F706 - the syntax error this case is about
