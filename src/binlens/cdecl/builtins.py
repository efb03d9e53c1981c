"""The C declarations every program gets for free: common libc and Win32 types, per ABI."""

from __future__ import annotations

from binlens.cdecl.abi import Abi


def libc_declarations(abi: Abi) -> str:
    """stdint/stddef/sys-types/stdio names, spelled for this data model."""
    i64 = "long" if abi.name == "LP64" else "long long"
    size = {"LP64": "unsigned long", "LLP64": "unsigned long long"}.get(abi.name, "unsigned int")
    ssize = {"LP64": "long", "LLP64": "long long"}.get(abi.name, "int")
    return f"""
typedef signed char int8_t; typedef unsigned char uint8_t;
typedef short int16_t; typedef unsigned short uint16_t;
typedef int int32_t; typedef unsigned int uint32_t;
typedef {i64} int64_t; typedef unsigned {i64} uint64_t;
typedef {ssize} intptr_t; typedef {size} uintptr_t;
typedef {size} size_t; typedef {ssize} ssize_t; typedef {ssize} ptrdiff_t;
typedef {i64} intmax_t; typedef unsigned {i64} uintmax_t;
typedef {abi.wchar} wchar_t; typedef unsigned int wint_t;
typedef _Bool bool;
typedef long off_t; typedef long long off64_t; typedef long time_t; typedef long clock_t;
typedef int pid_t; typedef unsigned int uid_t; typedef unsigned int gid_t; typedef unsigned int mode_t;
typedef unsigned int socklen_t; typedef unsigned short sa_family_t;
struct _IO_FILE; typedef struct _IO_FILE FILE;
typedef char *va_list;
struct timespec {{ time_t tv_sec; long tv_nsec; }};
struct timeval {{ time_t tv_sec; long tv_usec; }};
struct sockaddr {{ sa_family_t sa_family; char sa_data[14]; }};
struct in_addr {{ uint32_t s_addr; }};
struct sockaddr_in {{ sa_family_t sin_family; uint16_t sin_port; struct in_addr sin_addr; unsigned char sin_zero[8]; }};
"""


WIN32_DECLARATIONS = """
typedef unsigned char BYTE; typedef unsigned short WORD; typedef unsigned int DWORD;
typedef unsigned long long QWORD; typedef unsigned long long DWORD64;
typedef int BOOL; typedef unsigned char BOOLEAN; typedef char CHAR; typedef unsigned char UCHAR;
typedef short SHORT; typedef unsigned short USHORT; typedef int INT; typedef unsigned int UINT;
typedef int LONG; typedef unsigned int ULONG; typedef long long LONGLONG; typedef unsigned long long ULONGLONG;
typedef float FLOAT; typedef void VOID; typedef void *PVOID; typedef void *LPVOID; typedef const void *LPCVOID;
typedef unsigned short WCHAR; typedef char *LPSTR; typedef const char *LPCSTR;
typedef WCHAR *LPWSTR; typedef const WCHAR *LPCWSTR; typedef BYTE *PBYTE; typedef BYTE *LPBYTE;
typedef DWORD *PDWORD; typedef DWORD *LPDWORD; typedef LONG HRESULT; typedef LONG NTSTATUS;
typedef void *HANDLE; typedef HANDLE HMODULE; typedef HANDLE HINSTANCE; typedef HANDLE HWND;
typedef HANDLE HKEY; typedef HANDLE HDC; typedef HANDLE HGLOBAL; typedef HANDLE HLOCAL;
typedef int (*FARPROC)(void);
typedef struct _GUID { unsigned int Data1; unsigned short Data2; unsigned short Data3; unsigned char Data4[8]; } GUID;
typedef struct _FILETIME { DWORD dwLowDateTime; DWORD dwHighDateTime; } FILETIME;
typedef struct _UNICODE_STRING { USHORT Length; USHORT MaximumLength; WCHAR *Buffer; } UNICODE_STRING;
typedef struct _LIST_ENTRY { struct _LIST_ENTRY *Flink; struct _LIST_ENTRY *Blink; } LIST_ENTRY;
typedef union _LARGE_INTEGER { struct { DWORD LowPart; LONG HighPart; } u; LONGLONG QuadPart; } LARGE_INTEGER;
typedef struct _SECURITY_ATTRIBUTES { DWORD nLength; LPVOID lpSecurityDescriptor; BOOL bInheritHandle; }
    SECURITY_ATTRIBUTES;
"""


def win32_pointer_sized(abi: Abi) -> str:
    """Win32 integer types whose size follows the pointer."""
    i = "long long" if abi.pointer == 8 else "int"
    return f"""
typedef {i} INT_PTR; typedef unsigned {i} UINT_PTR; typedef {i} LONG_PTR; typedef unsigned {i} ULONG_PTR;
typedef ULONG_PTR SIZE_T; typedef LONG_PTR SSIZE_T; typedef ULONG_PTR DWORD_PTR;
typedef UINT_PTR WPARAM; typedef LONG_PTR LPARAM; typedef LONG_PTR LRESULT;
"""
