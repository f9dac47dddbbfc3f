"""The campaign's domain: budget, noise band, diagnosis, persisted state, the final result.

Plain Python; the Prefect flow (flows/campaign.py) and tasks (tasks/) wrap these functions.
"""
