
# include: traps_model

loss = model(x, t)
raise RuntimeError("stopped after forward")
