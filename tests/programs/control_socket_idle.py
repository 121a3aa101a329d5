
import sys
print("running", flush=True)
sys.stdin.readline()
