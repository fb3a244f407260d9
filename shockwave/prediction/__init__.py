"""Prediction: a job's future as a scheduler can know it.

The Bayesian regime predictor of the paper, its empirical-Bayes variant over the population
prior and the registry of regime predictors a policy plans with; the throughput model (seconds
per epoch where a job has not run yet, measured rather than given). Above the domain and the
workloads; knows no market and no policy.
"""
