"""The specification as code: experiments and their properties, validity rules, measured properties
and the result format (the SFTTrainer spec, IBM ado's SFTTrainer actuator: its names verbatim)."""
