
# include: exit_status_train

for _ in range(5):
    step()
print("training", flush=True)
while True:
    step()
