"""The administrators' web console: budgets, audit, releases, policy and jobs in a browser.

``dpsql serve --console`` serves it on localhost. Administrators log in with their
SQL password; every action button runs the same ``dpsql`` command as ``CALL
dpsql(...)`` does, as the logged-in administrator, and is audited. Modules:
``auth`` (logins, cookies, CSRF), ``pages`` (HTML), ``app`` (HTTP and data).
"""
