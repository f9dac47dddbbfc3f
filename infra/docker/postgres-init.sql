-- One Postgres for the self-hosted stack (infra/compose.yaml): Prefect's database and MLflow's.
-- Runs once, when the data volume is first created.
CREATE DATABASE prefect;
CREATE DATABASE mlflow;
