"""Training draft heads: on-policy data from the target via vLLM (`data`), target taps (`taps`),
the losses (`losses`) and one trainer for every registered method (`trainer`)."""
