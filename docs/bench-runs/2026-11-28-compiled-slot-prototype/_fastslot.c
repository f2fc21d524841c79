/* Prototype (not for src/): the slot thread's per-job system calls in C, to measure what compiled code saves.
   The child of vfork shares the parent's memory until it executes: what it does there is outside POSIX and relies
   on the compiler treating vfork as returning twice (as CPython's _posixsubprocess does); every signal is blocked
   across it and caught ones go back to their defaults before the mask is restored, so no handler of the worker
   runs in the child; its errno reaches the parent through a volatile variable of the parent's frame. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <signal.h>
#include <fcntl.h>
#include <unistd.h>
#include <errno.h>
#include <string.h>
#include <dirent.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <sys/resource.h>

static char **to_array(PyObject *seq) {
    Py_ssize_t n = PyList_GET_SIZE(seq);
    char **a = PyMem_Malloc((n + 1) * sizeof(char *));
    if (!a) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) a[i] = PyBytes_AS_STRING(PyList_GET_ITEM(seq, i));
    a[n] = NULL;
    return a;
}

/* spawn(path, argv, envp, out, err, flags) -> pid: vfork, setsid, default SIGPIPE/SIGXFSZ, files, exec. */
static PyObject *spawn(PyObject *self, PyObject *args) {
    const char *path, *out, *err; PyObject *argv, *envp; int flags;
    if (!PyArg_ParseTuple(args, "yO!O!yyi", &path, &PyList_Type, &argv, &PyList_Type, &envp, &out, &err, &flags))
        return NULL;
    char **av = to_array(argv), **ev = to_array(envp);
    if (!av || !ev) { PyMem_Free(av); PyMem_Free(ev); return PyErr_NoMemory(); }
    sigset_t all, old; sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    volatile int child_errno = 0;
    pid_t pid = vfork();
    if (pid == 0) {
        /* handlers the worker installed must not run here: every caught signal back to its default */
        for (int s = 1; s < NSIG; s++) {
            struct sigaction sa;
            if (sigaction(s, NULL, &sa) == 0 && sa.sa_handler != SIG_IGN && sa.sa_handler != SIG_DFL) {
                sa.sa_handler = SIG_DFL; sigaction(s, &sa, NULL);
            }
        }
        signal(SIGPIPE, SIG_DFL); signal(SIGXFSZ, SIG_DFL);
        setsid();
        int fd = open("/dev/null", O_RDONLY);
        if (fd < 0 || dup2(fd, 0) < 0) goto fail;
        if (fd != 0) close(fd);
        fd = open(out, flags, 0644);
        if (fd < 0 || dup2(fd, 1) < 0) goto fail;
        if (fd != 1) close(fd);
        fd = open(err, flags, 0644);
        if (fd < 0 || dup2(fd, 2) < 0) goto fail;
        if (fd != 2) close(fd);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        execve(path, av, ev);
    fail:
        child_errno = errno;
        _exit(127);
    }
    int saved = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    PyMem_Free(av); PyMem_Free(ev);
    if (pid < 0) { errno = saved; return PyErr_SetFromErrno(PyExc_OSError); }
    if (child_errno) {  /* the exec, or an open of a file (the error does not say which) */
        int st; while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
        errno = child_errno;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong(pid);
}

/* wait(pid): sleep until it exits (not reaped), GIL released. */
static PyObject *wait_exit(PyObject *self, PyObject *arg) {
    long pid = PyLong_AsLong(arg);
    siginfo_t si; int r;
    Py_BEGIN_ALLOW_THREADS
    do { r = waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT); } while (r < 0 && errno == EINTR);
    Py_END_ALLOW_THREADS
    if (r < 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/* reap(pid) -> (exit code as os.waitstatus_to_exitcode, cpu seconds): SIGKILL to its group, then wait4. */
static PyObject *reap(PyObject *self, PyObject *arg) {
    long pid = PyLong_AsLong(arg);
    killpg((pid_t)pid, SIGKILL);
    int st; struct rusage ru; pid_t r;
    do { r = wait4((pid_t)pid, &st, 0, &ru); } while (r < 0 && errno == EINTR);
    if (r < 0) return PyErr_SetFromErrno(PyExc_OSError);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? -WTERMSIG(st) : 0;
    double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
    return Py_BuildValue("(id)", code, cpu);
}

static PyObject *tail_of(int dirfd, const char *name, off_t limit, int *empty) {
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) || !st.st_size)
        return PyUnicode_FromStringAndSize("", 0);
    *empty = 0;
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return PyUnicode_FromStringAndSize("", 0);
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || !st.st_size) { close(fd); return PyUnicode_FromStringAndSize("", 0); }
    off_t n = st.st_size < limit ? st.st_size : limit;
    char *buf = PyMem_Malloc(n ? n : 1);
    ssize_t got = pread(fd, buf, n, st.st_size - n);
    close(fd);
    PyObject *s = PyUnicode_DecodeUTF8(buf, got > 0 ? got : 0, "replace");
    PyMem_Free(buf);
    return s;
}

/* finish(jobdir, out_name, err_name, limit) -> (stdout tail, stderr tail, clean): the tails, then the directory
   emptied but for the two output files kept when sound; clean None: something to leave to Python's clean_dir. */
static PyObject *finish(PyObject *self, PyObject *args) {
    const char *dir, *on, *en; long limit;
    if (!PyArg_ParseTuple(args, "yyyl", &dir, &on, &en, &limit)) return NULL;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return Py_BuildValue("(ssO)", "", "", Py_None);
    int empty = 1;
    PyObject *o = tail_of(dfd, on, limit, &empty), *e = tail_of(dfd, en, limit, &empty);
    int fd2 = fcntl(dfd, F_DUPFD_CLOEXEC, 0);  /* finish runs outside the spawn lock: never inherited by a job */
    DIR *d = fdopendir(fd2);
    PyObject *clean = Py_None;
    if (d) {
        int sound = 1; struct dirent *ent;
        while ((ent = readdir(d))) {
            const char *n = ent->d_name;
            if (!strcmp(n, ".") || !strcmp(n, "..")) continue;
            struct stat st;
            if (!strcmp(n, on) || !strcmp(n, en)) {
                if (fstatat(dfd, n, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0600) == 0600
                    && st.st_nlink == 1) continue;
                sound = 0; continue;
            }
            if (ent->d_type == DT_DIR || unlinkat(dfd, n, 0) < 0) sound = 0;
        }
        closedir(d);
        clean = sound ? (empty ? Py_True : Py_False) : Py_None;
    } else close(fd2);
    close(dfd);
    PyObject *r = Py_BuildValue("(NNO)", o, e, clean);
    return r;
}

static PyMethodDef methods[] = {
    {"spawn", spawn, METH_VARARGS, NULL}, {"wait", wait_exit, METH_O, NULL}, {"reap", reap, METH_O, NULL},
    {"finish", finish, METH_VARARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_fastslot", NULL, -1, methods};
PyMODINIT_FUNC PyInit__fastslot(void) { return PyModule_Create(&mod); }
