import multiprocessing as mp
import pickle

class Point:
    def __init__(self, x):
        self.x = x

def square(p):
    return Point(p.x * p.x)

if __name__ == "__main__":
    p = pickle.loads(pickle.dumps(Point(3)))
    print(type(p).__module__, type(p).__qualname__, p.x)
    for method in ("spawn", "forkserver"):
        with mp.get_context(method).Pool(2) as pool:
            print(method, [q.x for q in pool.map(square, [Point(i) for i in range(4)])])
