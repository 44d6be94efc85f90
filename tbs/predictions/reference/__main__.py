"""Refit the GPU model on the reference data and write fitted.json: python -m tbs.predictions.reference"""

from tbs.predictions.reference import refit

if __name__ == "__main__":
    record = refit()
    print({k: v for k, v in record["model"].items() if not isinstance(v, dict)})
