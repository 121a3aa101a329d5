import os
with open(os.environ["SITECUSTOMIZE_LOG"], "a") as f:
    f.write("user sitecustomize ran\n")
MARK = "user"
