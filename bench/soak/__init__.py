"""The fault soak: `python -m bench soak` runs short jobs, each with one random fault, and
checks every end against the README's rules and that nothing of the job is left.

plan.py draws each job's fault from the seed, runner.py runs it and does the fault,
judge.py holds the rules, tally.py the table; cli.py is the command.
"""
