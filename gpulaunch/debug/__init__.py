"""Seeing inside a running job: the ranks' stacks (py-spy) and the hang detector."""
